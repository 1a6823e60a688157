"""The outside providers' adapter the executor and the projector share: carry out a tool's operation with its key
(over HTTP, or as a KV write), ask a provider about a key, and answer the by-key view the console asks for."""
