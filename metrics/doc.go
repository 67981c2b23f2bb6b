// Package metrics counts what goes through tunnelkit edges and agents as
// Prometheus metrics. It lives in a module of its own, so that the
// Prometheus client reaches only the programs that import it: the core
// (packages edge and agent) knows nothing of Prometheus and tells what it
// counts to an Observer, which this package implements.
//
// An Edge is an edge.Observer; an Agent is an agent.Observer, and its Event
// method an agent.Client's OnEvent. Each is also a prometheus.Collector, to
// register on any prometheus.Registerer. Typical use:
//
//	m := metrics.NewEdge()
//	prometheus.MustRegister(m)
//	srv := &edge.Server{Domain: "example.com", Observer: m}
//	go http.ListenAndServe("127.0.0.1:9100", promhttp.Handler())
//
// and on the agent's side:
//
//	m := metrics.NewAgent()
//	prometheus.MustRegister(m)
//	c := &agent.Client{Addrs: []string{"edge.example.com:7000"}, Observer: m, OnEvent: m.Event}
//
// To tell several edges or clients in one process apart, give each its own
// Edge or Agent and register it through prometheus.WrapRegistererWith, with
// a constant label of your choosing.
//
// # Metrics of an Edge
//
// In and out are seen from the public clients: "in" is what a client sent
// towards the agent, "out" what came back to it. For HTTP and HTTPS, the
// bytes are those of the bodies, counted as each request ends; a TLS or TCP
// connection's are counted when it ends. Streams are all those of the
// agents' sessions, their heartbeats and control requests included.
//
//	tunnelkit_edge_sessions                        gauge      agent sessions open (their hello accepted)
//	tunnelkit_edge_endpoints{proto}                gauge      endpoints bound by agents
//	tunnelkit_edge_streams                         gauge      streams open to and from agents
//	tunnelkit_edge_connections_total{proto}        counter    public connections accepted
//	tunnelkit_edge_bytes_total{proto,direction}    counter    bytes between public clients and agents; direction "in" or "out"
//	tunnelkit_edge_http_requests_total{proto,code} counter    HTTP requests routed, by status class: code "1xx" to "5xx"
//	tunnelkit_edge_http_request_duration_seconds{proto}
//	                                               histogram  time from a request's arrival to the end of its response
//	tunnelkit_edge_refused_total{reason}           counter    agents, connections and requests the edge refused
//
// proto is "http" (plain HTTP), "https" (HTTP over TLS the edge
// terminated), "tls" (TLS passed through to the agent) or "tcp". The
// reasons are the stable codes of edge.Reasons ("auth", "no_endpoint",
// "client_limit", "app_error"...). Every label has a bounded set of
// values: a protocol, status or reason outside these sets (which the core
// does not report today) is counted under "other", so no label ever
// carries a client's address, a name or anything else a stranger chooses.
//
// # Metrics of an Agent
//
//	tunnelkit_agent_connected                       gauge    1 while the client holds a session to an edge, else 0
//	tunnelkit_agent_reconnects_total                counter  reconnection attempts (agent.Reconnecting events): to open a session again, to bind endpoints not granted yet, or to open the first while Listen waits for the edge
//	tunnelkit_agent_connections_total{proto}        counter  public connections that reached the client's listeners
//	tunnelkit_agent_bytes_total{proto,direction}    counter  bytes of those connections, counted when each closes; direction "in" (from the client) or "out"
//
// An Agent observes one Client: the connected gauge follows that client's
// events.
//
// # Cost
//
// Every combination of labels the core reports is resolved when an Edge or
// Agent is made, so that counting on the request path is a switch (a map
// lookup for a refusal) and a few atomic operations, with no allocation
// and no lock: about 70 ns for all an HTTP request's counts on the edge,
// and 35 ns for a connection's on the agent, where the request itself
// costs hundreds of microseconds.
package metrics
