"""Generated from api.proto: run tools/gen_protos.py after editing it."""
