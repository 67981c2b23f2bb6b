package rules_test

import (
	"encoding/json"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/testchrome"
	"github.com/tunnelkit/tunnelkit/internal/testtools"
)

// A browser follows a rule's 301 to the app, and shows a rule's custom
// maintenance page as the page it is.
func TestChromiumRedirectAndCustomPage(t *testing.T) {
	testtools.Need(t, "chromium")
	srv := hop(t, mustCompile(t, "http", `{"on_http_request":[
		{"name":"maintenance","expressions":["req.url.path == '/deploying'"],"actions":[{"type":"custom-response","config":{"status_code":503,
			"headers":{"Content-Type":"text/html; charset=utf-8"},
			"body":"<!doctype html><title>Maintenance</title><h1 id=\"m\">Back soon</h1><p>${req.url.path} is being deployed.</p>"}}]},
		{"name":"old","actions":[{"type":"redirect","config":{"from":"/old/(.*)","to":"/new/$1","status_code":301}}]}]}`))
	u, _ := url.Parse(srv.URL)
	base := "http://shop.example.test:" + u.Port()
	page := testchrome.Start(t, base+"/old/shoes?size=42", "--host-resolver-rules=MAP *.example.test 127.0.0.1")
	page.WaitLoad(t, `document.body && document.body.textContent.startsWith('app:')`, 20*time.Second)
	var href, text string
	json.Unmarshal([]byte(page.Eval(t, `location.href`)), &href)
	json.Unmarshal([]byte(page.Eval(t, `document.body.textContent`)), &text)
	if href != base+"/new/shoes?size=42" || !strings.HasPrefix(text, "app: GET /new/shoes?size=42") {
		t.Errorf("after the redirect: %s %q", href, text)
	}

	page.Navigate(t, base+"/deploying")
	page.WaitLoad(t, `document.getElementById('m') !== null`, 20*time.Second)
	var title, p string
	json.Unmarshal([]byte(page.Eval(t, `document.title`)), &title)
	json.Unmarshal([]byte(page.Eval(t, `document.querySelector('p').textContent`)), &p)
	if title != "Maintenance" || p != "/deploying is being deployed." {
		t.Errorf("the custom page: title %q, %q", title, p)
	}
}
