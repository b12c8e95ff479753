"""asyncio orchestration of the core and the adapters (injected, never imported)."""
