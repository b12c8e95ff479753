"""The v1 config file: schema, loading, validation and flag/env precedence."""
