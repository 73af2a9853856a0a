"""Model loading (hub, local, builtin tiny models) and the synthetic arithmetic task."""
