"""The graph IR: an exported training step read into an OpGraph (ops, tensors with bytes at a
reference batch, batch axes found by shape inference, variables and their updates), and the
grouping of ops into the units a strategy decides on."""
