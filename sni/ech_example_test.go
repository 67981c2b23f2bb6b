package sni_test

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"math/big"
	"net"
	"time"

	"github.com/tunnelkit/tunnelkit/sni"
)

// An edge holding an ECH key reads the name an ECH client really asks for,
// which its hello carries encrypted.
func ExampleECHKeys_Decrypt() {
	// Once: a key, and the ECHConfigList to publish in the DNS HTTPS
	// record of the names behind the edge (here handed to the client).
	key, configList, err := sni.NewECHKey("public.example.com")
	if err != nil {
		fmt.Println(err)
		return
	}
	keys, err := sni.NewECHKeys([]tls.EncryptedClientHelloKey{key})
	if err != nil {
		fmt.Println(err)
		return
	}

	clientSide, serverSide := net.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer clientSide.Close()
		cfg := &tls.Config{ServerName: "secret.example.com", EncryptedClientHelloConfigList: configList}
		tls.Client(clientSide, cfg).Handshake() // fails when the example closes its end
	}()

	hello, conn, err := sni.Peek(serverSide)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { conn.Close(); <-done }()
	fmt.Println("visible name:", hello.ServerName)
	res, err := keys.Decrypt(hello)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("inner name:", res.Inner.ServerName)
	inner, _ := sni.Parse(res.Records) // what the backend is sent instead
	fmt.Println("the backend's hello carries ECH:", inner.ECH)
	// Output:
	// visible name: public.example.com
	// inner name: secret.example.com
	// the backend's hello carries ECH: true
}

// An edge relays an ECH connection to a backend that completes the
// handshake, a plain crypto/tls server with no ECH key. This backend
// accepts only P-256 key shares, so it answers the client's first hello
// with a HelloRetryRequest: Wrap decrypts the client's second hello too.
func ExampleECHResult_Wrap() {
	cert, roots := selfSigned("secret.example.com")
	key, configList, _ := sni.NewECHKey("public.example.com")
	keys, _ := sni.NewECHKeys([]tls.EncryptedClientHelloKey{key})

	clientSide, edgeIn := net.Pipe()
	edgeOut, backendSide := net.Pipe()
	go func() { // the backend: echoes lines
		tc := tls.Server(backendSide, &tls.Config{
			Certificates:     []tls.Certificate{cert},
			CurvePreferences: []tls.CurveID{tls.CurveP256},
		})
		defer tc.Close()
		io.Copy(tc, tc)
	}()
	edgeDone := make(chan struct{})
	go func() { // the edge
		defer close(edgeDone)
		hello, conn, err := sni.Peek(edgeIn)
		if err != nil {
			conn.Close()
			edgeOut.Close()
			return
		}
		res, err := keys.Decrypt(hello)
		if err != nil {
			fmt.Println(err)
			conn.Close()
			edgeOut.Close()
			return
		}
		fmt.Printf("route by %s, not %s\n", res.Inner.ServerName, hello.ServerName)
		// Wrap takes the conn Peek returned, which replays the outer
		// hello, and the conn to the backend chosen by the inner name.
		client, backend := res.Wrap(conn, edgeOut)
		go func() {
			io.Copy(backend, client)
			backend.Close()
		}()
		io.Copy(client, backend)
		client.Close()
	}()

	tc := tls.Client(clientSide, &tls.Config{
		ServerName:                     "secret.example.com",
		RootCAs:                        roots,
		EncryptedClientHelloConfigList: configList,
	})
	fmt.Fprintln(tc, "hello through the edge")
	line, _ := bufio.NewReader(tc).ReadString('\n')
	fmt.Print("echoed: ", line)
	st := tc.ConnectionState()
	fmt.Println("ECH accepted:", st.ECHAccepted, "- key exchange:", st.CurveID)
	tc.Close()
	<-edgeDone
	// Output:
	// route by secret.example.com, not public.example.com
	// echoed: hello through the edge
	// ECH accepted: true - key exchange: CurveP256
}

// selfSigned returns a certificate for name, and a pool that trusts it.
func selfSigned(name string) (tls.Certificate, *x509.CertPool) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		DNSNames:     []string{name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, _ := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	leaf, _ := x509.ParseCertificate(der)
	roots := x509.NewCertPool()
	roots.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, roots
}
