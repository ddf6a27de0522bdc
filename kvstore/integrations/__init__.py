"""Native integrations of kvstore with serving engines (SGLang HiCache; vLLM planned)."""
