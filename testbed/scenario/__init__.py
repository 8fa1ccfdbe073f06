"""A scenario: the TOML loader (config), one module of rules per section, the built-in scenarios (builtin/)."""
