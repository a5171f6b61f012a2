"""Model configs: one class per architecture, found by `type`, with no JAX (the server and the CLI load them).

- `base.py`: `BaseModelConfig`, the fields and counts every architecture shares, the presets (`PRESETS`), the
  attention and remat choices and the Hugging Face mapping's types (`HFKey`, `HFWeight`);
- `configs.py`: `ModelConfig`, the union of the architectures registered in `ARCHITECTURES` by `type`
  (`LlamaConfig`, its kin `MistralConfig`, `Qwen2Config` and `Qwen3Config`, and `GPT2Config`); each owns its MLP
  width, parameter and FLOP counts and Hugging Face mapping (one table of `config.json` keys, one of tensors,
  each read both ways), and names its `flax.nnx` module in `tradewind.trainer.models`.
"""
