#!/usr/bin/env python3
"""The peer side of etude's Hugging Face cross-check: a tiny random MusicgenForCausalLM from PyPI's
`transformers`, written by people who did not write etude.

  hf_musicgen_ref.py probe                      exit 0 if torch and transformers' MusicGen import, 3 if not
  hf_musicgen_ref.py run DIR K C D H L S B LC   builds the model, saves it with save_pretrained
                                                (DIR/hf/model.safetensors, transformers' own names) and
                                                DIR/io.safetensors: the tokens, the condition states and
                                                mask, and the logits of three forwards
  hf_musicgen_ref.py reload DIR FILE OUT        a model of DIR/hf's config whose every parameter is
                                                read from FILE (etude's save_hf_weights), strictly;
                                                the masked forward of DIR/io.safetensors' inputs, the
                                                states through FILE's enc_to_dec_proj and masked as
                                                MusicgenForConditionalGeneration does, into OUT

The configuration is set so the decoder computes what AudioCraft's MusicGen LM (and etude) does:
  activation_function="gelu"   transformers' GELUActivation, the exact erf form (AudioCraft's F.gelu)
  scale_embedding=False        no sqrt(D) on the summed token embeddings (AudioCraft has none)
  ffn_dim=4*D                  AudioCraft's dim_feedforward
  dropout, attention_dropout, activation_dropout, layerdrop = 0, and eval(): no randomness
  vocab_size=C                 heads of C classes; embed_tokens have C + 1 rows (the special token C)
  pad_token_id=bos_token_id=C  only used by generate(); the forward reads token C as any other row
Fixed by transformers, not by the config, and equal to AudioCraft's: LayerNorm eps 1e-5; no bias
in q/k/v/out/fc1/fc2/lm_heads; queries scaled by head_dim**-0.5; sinusoidal positions with the cos
half first and log(10000)/(half-1) in the exponent (MusicgenSinusoidalPositionalEmbedding, built in
float32 where etude builds its table in double: the one rounding difference left); input_ids
(B*K, S), logits (B*K, S, C) from a stack (B, K, S, C).

Forwards: (a) encoder_hidden_states=None (no cross-attention at all); (b) zero-padded states with
encoder_attention_mask (what MusicgenForConditionalGeneration does after enc_to_dec_proj: etude's
fuse::cross); (c) the same states without a mask (AudioCraft's unmasked attention, etude's
fuse::cross_unmasked). Batch row 0 has every condition position, row 1 the first two, row 2 none.

Exit status: 0 success, 1 a failure (printed), 3 torch/transformers not importable.
"""
import os
import sys

try:
    import torch
    import transformers
    from transformers import MusicgenDecoderConfig, MusicgenForCausalLM
    from safetensors.torch import load_file, save_file
except ImportError as exc:  # the C++ test turns this into a skip with a warning
    print(f"hf_musicgen_ref.py: cannot import torch/transformers' MusicGen: {exc}; install with: "
          f"{sys.executable} -m pip install --break-system-packages 'transformers==4.39.3' "
          f"(torch: Debian's python3-torch)")
    sys.exit(3)


def tiny_model(k, c, d, h, layers):
    """A random MusicgenForCausalLM computing what etude's LM does (the configuration above), in eval
    mode, its LayerNorm parameters moved off 1 and 0. Also the base of peft_lora_ref.py."""
    config = MusicgenDecoderConfig(
        vocab_size=c, num_codebooks=k, hidden_size=d, num_attention_heads=h, num_hidden_layers=layers,
        ffn_dim=4 * d, max_position_embeddings=64, activation_function="gelu", scale_embedding=False,
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, layerdrop=0.0,
        # transformers draws N(0, initializer_factor): D**-0.5 keeps activations and logits of order 1
        initializer_factor=d ** -0.5, pad_token_id=c, bos_token_id=c, tie_word_embeddings=False)
    model = MusicgenForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # LayerNorm weights and biases: off 1 and 0, so a swapped pair shows
                p.add_(0.2 * torch.randn_like(p))
    return model


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "probe":
        print(f"torch {torch.__version__}, transformers {transformers.__version__}")
        return 0
    if len(sys.argv) == 5 and sys.argv[1] == "reload":
        return reload(*sys.argv[2:])
    if len(sys.argv) != 11 or sys.argv[1] != "run":
        print(__doc__)
        return 1
    out = sys.argv[2]
    k, c, d, h, layers, s, b, lc = (int(v) for v in sys.argv[3:])
    torch.manual_seed(20240612)
    torch.set_num_threads(1)
    model = tiny_model(k, c, d, h, layers)

    tokens = torch.randint(0, c + 1, (b, k, s))  # (B, K, S), the special token C included
    mask = torch.zeros(b, lc, dtype=torch.long)  # (B, LC)
    mask[0, :] = 1
    mask[1, :2] = 1
    states = torch.randn(b, lc, d) * mask[..., None]  # (B, LC, D), zero at padded positions
    with torch.no_grad():
        ids = tokens.reshape(b * k, s)
        plain = model(input_ids=ids).logits
        masked = model(input_ids=ids, encoder_hidden_states=states, encoder_attention_mask=mask).logits
        unmasked = model(input_ids=ids, encoder_hidden_states=states).logits
    model.save_pretrained(os.path.join(out, "hf"), safe_serialization=True)
    save_file({
        "tokens": tokens.to(torch.int32).contiguous(),
        "states": states.contiguous(),
        "mask": mask.to(torch.float32).contiguous(),
        "logits_plain": plain.reshape(b, k, s, c).contiguous(),
        "logits_masked": masked.reshape(b, k, s, c).contiguous(),
        "logits_unmasked": unmasked.reshape(b, k, s, c).contiguous(),
    }, os.path.join(out, "io.safetensors"))
    print(f"torch {torch.__version__}, transformers {transformers.__version__}: "
          f"{sum(p.numel() for p in model.parameters())} values")
    return 0


def reload(out, file, result):
    torch.set_num_threads(1)
    model = MusicgenForCausalLM(MusicgenDecoderConfig.from_pretrained(os.path.join(out, "hf"))).eval()
    state = load_file(file)
    proj_w, proj_b = state.pop("enc_to_dec_proj.weight"), state.pop("enc_to_dec_proj.bias")
    missing, unexpected = model.load_state_dict(state, strict=False)
    # the sinusoidal positions (a frozen nn.Parameter in transformers) are computed, not learned
    params = {name for name, _ in model.named_parameters() if "embed_positions" not in name}
    missing = [m for m in missing if m in params]
    if missing or unexpected:
        print(f"reload: {file}: missing {missing}, unexpected {unexpected}")
        return 1
    io = load_file(os.path.join(out, "io.safetensors"))
    tokens, states, mask = io["tokens"].long(), io["states"], io["mask"]
    b, k, s = tokens.shape
    with torch.no_grad():
        projected = (states @ proj_w.T + proj_b) * mask[..., None]
        logits = model(input_ids=tokens.reshape(b * k, s), encoder_hidden_states=projected,
                       encoder_attention_mask=mask.long()).logits
    save_file({"logits_masked": logits.reshape(b, k, s, -1).contiguous()}, result)
    print(f"reloaded {len(state)} tensors from {file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
