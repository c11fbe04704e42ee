"""A test bed of real parts: tiny models built on this machine, and vLLM's CPU settings."""
