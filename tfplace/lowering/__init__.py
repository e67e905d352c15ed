"""The lowering: `lower(OpGraph, Cluster, Strategy, Profile) -> PlacedGraph`, the one place
where strategy semantics live. The simulator costs the PlacedGraph; the rewrite emits it."""
