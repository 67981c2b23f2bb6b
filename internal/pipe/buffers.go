package pipe

import "sync"

// proxyBufferSize is the size of the buffers ProxyBuffers lends.
const proxyBufferSize = 32 << 10

var proxyBuffers = sync.Pool{New: func() any { return new([proxyBufferSize]byte) }}

// ProxyBuffers is an httputil.BufferPool of 32 KiB buffers, the size
// ReverseProxy copies bodies with, shared by every reverse proxy of the
// module. It pools arrays rather than slices, so that Put allocates
// nothing.
var ProxyBuffers proxyBufferPool

type proxyBufferPool struct{}

// Get returns a buffer of 32 KiB.
func (proxyBufferPool) Get() []byte { return proxyBuffers.Get().(*[proxyBufferSize]byte)[:] }

// Put takes back a buffer Get returned; any other is left to the garbage
// collector.
func (proxyBufferPool) Put(b []byte) {
	if len(b) == proxyBufferSize {
		proxyBuffers.Put((*[proxyBufferSize]byte)(b))
	}
}
