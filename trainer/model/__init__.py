"""The model a rank trains: its spec and precision, the build (meta device, FSDP2 units,
weights loaded), the built-in byte model, HF models and LoRA adapters, attention, the LM head
with its fused loss, per-run kernel choices, the optimizer, and GGUF conversion."""
