module github.com/tunnelkit/tunnelkit

go 1.26

require (
	github.com/hashicorp/errwrap v1.0.0 // indirect
	github.com/hashicorp/go-multierror v1.1.1 // indirect
	golang.ngrok.com/muxado/v2 v2.0.2 // indirect
	golang.org/x/crypto v0.59.0 // indirect
)
