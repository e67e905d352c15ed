"""The runtime-overhead model: what a CPU runtime adds beyond kernels and links (message
handlers, dispatch CPU, collective CPU). An optional pass over a PlacedGraph; GPU clusters skip it."""
