module github.com/tunnelkit/tunnelkit

go 1.26.0

require (
	golang.ngrok.com/muxado/v2 v2.0.2
	golang.org/x/crypto v0.59.0
	golang.org/x/net v0.62.0
)
