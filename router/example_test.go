package router_test

import (
	"errors"
	"fmt"

	"github.com/tunnelkit/tunnelkit/router"
)

func ExampleTable() {
	var t router.Table[string]
	t.Add("app.example.test", "10.0.0.1:443")
	t.Add("app.example.test", "10.0.0.2:443")
	t.Add("*.example.test", "10.0.0.9:443")

	for _, name := range []string{"APP.example.test.", "api.example.test", "example.org"} {
		b, ok := t.Next(name)
		fmt.Println(name, "->", b, ok)
	}
	// Output:
	// APP.example.test. -> 10.0.0.1:443 true
	// api.example.test -> 10.0.0.9:443 true
	// example.org ->  false
}

func ExampleTable_Backends() {
	var t router.Table[string]
	t.Add("app.example.test", "down:1")
	t.Add("app.example.test", "up:2")

	dial := func(addr string) error {
		if addr == "down:1" {
			return errors.New("connection refused")
		}
		return nil
	}
	for range 2 {
		for addr := range t.Backends("app.example.test") {
			if err := dial(addr); err != nil {
				fmt.Println(addr, "failed:", err)
				t.Fail(addr) // skipped for router.DefaultCooldown
				continue
			}
			fmt.Println("connected to", addr)
			break
		}
	}
	// Output:
	// down:1 failed: connection refused
	// connected to up:2
	// connected to up:2
}
