"""Model loading (hub, local, builtin tiny models) and GGUF conversion; task generators: services/tasks/."""
