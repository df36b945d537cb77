"""The Backend contract's ops, one file per op (a package: its basenames may repeat tests/')."""
