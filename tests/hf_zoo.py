"""A zoo of Hugging Face models in tiny configurations (random weights, nothing downloaded), with
inputs for each: what tests/test_hf_zoo.py compiles and compares with eager, and what
benchmarks/real_models.py measures at real sizes.

Each entry: name -> (make the model, make the inputs as (args, kwargs)). Sizes are odd on
purpose (37 wide, 7 tokens) so that no kernel lines up with a power of two by luck."""
import torch

WIDTH, LAYERS, HEADS, FFN, VOCAB = 32, 2, 4, 37, 99


def _text(batch=2, length=7):
    def make():
        ids = torch.randint(0, VOCAB, (batch, length))
        mask = torch.ones(batch, length, dtype=torch.long)
        mask[0, -2:] = 0                       # padding in one row: the attention mask matters
        return (ids,), {"attention_mask": mask}
    return make


def _decoder_text(batch=2, length=7):
    def make():
        return (torch.randint(0, VOCAB, (batch, length)),), {}
    return make


def _pixels(size=32, channels=3, batch=2):
    def make():
        return (torch.randn(batch, channels, size, size),), {}
    return make


def _seq2seq(batch=2, length=7):
    def make():
        ids = torch.randint(0, VOCAB, (batch, length))
        return (ids,), {"decoder_input_ids": torch.randint(0, VOCAB, (batch, 5))}
    return make


def _cfg(cls, **kw):
    import transformers as T
    return getattr(T, cls)(**kw)


def _standard(cfg_cls, model_cls, **extra):
    """A model whose config takes the usual names (hidden_size, num_hidden_layers...)."""
    def make():
        import transformers as T
        cfg = _cfg(cfg_cls, hidden_size=WIDTH, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                   intermediate_size=FFN, vocab_size=VOCAB, **extra)
        return getattr(T, model_cls)(cfg)
    return make


def _make(model_cls, cfg_cls, **cfg):
    def make():
        import transformers as T
        return getattr(T, model_cls)(_cfg(cfg_cls, **cfg))
    return make


ZOO = {
    "bert": (_standard("BertConfig", "BertModel"), _text()),
    "distilbert": (_make("DistilBertModel", "DistilBertConfig", dim=WIDTH, n_layers=LAYERS, n_heads=HEADS,
                         hidden_dim=FFN, vocab_size=VOCAB), _text()),
    "roberta": (_standard("RobertaConfig", "RobertaModel"), _text()),
    "albert": (_standard("AlbertConfig", "AlbertModel", embedding_size=16), _text()),
    "electra": (_standard("ElectraConfig", "ElectraModel", embedding_size=16), _text()),
    "gpt2": (_make("GPT2LMHeadModel", "GPT2Config", n_embd=WIDTH, n_layer=LAYERS, n_head=HEADS,
                   n_inner=FFN, vocab_size=VOCAB, bos_token_id=0, eos_token_id=0), _decoder_text()),
    "gpt_neox": (_standard("GPTNeoXConfig", "GPTNeoXForCausalLM"), _decoder_text()),
    "opt": (_make("OPTForCausalLM", "OPTConfig", hidden_size=WIDTH, num_hidden_layers=LAYERS,
                  num_attention_heads=HEADS, ffn_dim=FFN, vocab_size=VOCAB, word_embed_proj_dim=WIDTH,
                  bos_token_id=0, eos_token_id=0, pad_token_id=1), _decoder_text()),
    "llama": (_standard("LlamaConfig", "LlamaForCausalLM", num_key_value_heads=2), _decoder_text()),
    "mistral": (_standard("MistralConfig", "MistralForCausalLM", num_key_value_heads=2), _decoder_text()),
    "qwen2": (_standard("Qwen2Config", "Qwen2ForCausalLM", num_key_value_heads=2), _decoder_text()),
    "t5": (_make("T5Model", "T5Config", d_model=WIDTH, d_kv=8, d_ff=FFN, num_layers=LAYERS,
                 num_heads=HEADS, vocab_size=VOCAB, decoder_start_token_id=0), _seq2seq()),
    "bart": (_make("BartModel", "BartConfig", d_model=WIDTH, encoder_layers=LAYERS, decoder_layers=LAYERS,
                   encoder_attention_heads=HEADS, decoder_attention_heads=HEADS, encoder_ffn_dim=FFN,
                   decoder_ffn_dim=FFN, vocab_size=VOCAB, max_position_embeddings=64), _seq2seq()),
    "vit": (_make("ViTModel", "ViTConfig", hidden_size=WIDTH, num_hidden_layers=LAYERS,
                  num_attention_heads=HEADS, intermediate_size=FFN, image_size=32, patch_size=8), _pixels()),
    "convnext": (_make("ConvNextModel", "ConvNextConfig", hidden_sizes=[8, 16, 24, 32], depths=[1, 1, 1, 1],
                       image_size=32), _pixels()),
    "swin": (_make("SwinModel", "SwinConfig", image_size=32, patch_size=4, embed_dim=16, depths=[1, 1],
                   num_heads=[2, 4], window_size=4), _pixels()),
    "resnet": (_make("ResNetModel", "ResNetConfig", embedding_size=16, hidden_sizes=[16, 24, 32, 40],
                     depths=[1, 1, 1, 1]), _pixels()),
    "mobilenet_v2": (_make("MobileNetV2Model", "MobileNetV2Config", image_size=32, depth_multiplier=0.35),
                     _pixels()),
    # a selective state-space model: its scan is torch's associative_scan when compiled
    "mamba": (_make("MambaForCausalLM", "MambaConfig", hidden_size=WIDTH, num_hidden_layers=LAYERS,
                    vocab_size=VOCAB, state_size=4, expand=2, conv_kernel=4, time_step_rank=4), _decoder_text()),
    # sliding-window attention: overlapping chunks by as_strided, x.where(mask, y), writes into
    # views of a new tensor; padded to a multiple of the window
    "longformer": (_make("LongformerModel", "LongformerConfig", hidden_size=WIDTH, num_hidden_layers=1,
                         num_attention_heads=HEADS, intermediate_size=FFN, vocab_size=VOCAB,
                         attention_window=4), _text()),
}

# models that break where TorchDynamo breaks too, and why
BREAKS_AS_DYNAMO = {
    "longformer": "is_global_attn = ....any().item(): a Python bool from tensor values",
}


def outputs(out):
    """The tensors of a model's output (a ModelOutput, tuple or tensor), in a fixed order."""
    if isinstance(out, torch.Tensor):
        return [out]
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    flat = []
    for v in out if isinstance(out, (tuple, list)) else []:
        flat += outputs(v) if isinstance(v, (tuple, list)) or hasattr(v, "to_tuple") else \
            [v] if isinstance(v, torch.Tensor) else []
    return flat
