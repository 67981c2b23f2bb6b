module github.com/tunnelkit/tunnelkit

go 1.26.0

require (
	github.com/hashicorp/go-multierror v1.1.1
	golang.ngrok.com/muxado/v2 v2.0.2
	golang.org/x/crypto v0.59.0
	golang.org/x/net v0.62.0
	golang.org/x/time v0.16.0
)

require (
	github.com/hashicorp/errwrap v1.0.0 // indirect
	golang.org/x/text v0.44.0 // indirect
)
