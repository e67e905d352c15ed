"""The rewrite pass: a PlacedGraph emitted as TensorFlow ops (replicas, re-splits,
collectives, PS exchanges, init copies, priority chains), and the session hook that applies it."""
