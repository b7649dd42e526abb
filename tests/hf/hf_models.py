"""Tiny Hugging Face Transformers models built from configs (random weights,
nothing downloaded), used the ways people use them, for dynaflow apply's
end-to-end tests (tests/hf_apply_test.py).

  python hf_models.py --family llama --patterns all --out result.pt

runs each usage pattern and saves {pattern: {"tokens": LongTensor,
"logits": [Tensor]}} to --out, so two runs (unmodified and under
`dynaflow apply`) can be compared. --apply PLAN applies the plan in process
with `dynaflow.apply(model, PLAN)` instead of through the bootstrap. --warmup
runs the patterns once before the recorded run: under dynaflow apply the
first call of each kind runs the original way (its audit), so the recorded
run is split throughout.
"""

import argparse
import sys

import torch
import transformers as tf

BATCH = 4
PROMPT = 12
NEW_TOKENS = 3
VOCAB = 128


def tiny_config(family):
    common = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  max_position_embeddings=64, pad_token_id=0, eos_token_id=None,
                  bos_token_id=1)
    if family == "llama":
        return tf.LlamaConfig(intermediate_size=128, num_key_value_heads=2, **common)
    if family == "qwen2":
        return tf.Qwen2Config(intermediate_size=128, num_key_value_heads=2, **common)
    if family == "mixtral":
        return tf.MixtralConfig(intermediate_size=96, num_key_value_heads=2, num_local_experts=4,
                                num_experts_per_tok=2, **common)
    if family == "gpt2":
        return tf.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                             pad_token_id=0, eos_token_id=None, bos_token_id=1)
    if family == "mistral":
        return tf.MistralConfig(intermediate_size=128, num_key_value_heads=2, sliding_window=8,
                                **common)
    if family == "gemma2":  # sliding and global layers, attention and final logit softcapping
        return tf.Gemma2Config(intermediate_size=128, num_key_value_heads=2, head_dim=16,
                               sliding_window=8, **common)
    if family == "mamba":  # its own cache (cache_params): state no adapter merges
        return tf.MambaConfig(vocab_size=VOCAB, hidden_size=64, state_size=8, num_hidden_layers=2,
                              pad_token_id=0, eos_token_id=None, bos_token_id=1)
    if family == "lfm2":  # short-convolution layers: state no adapter merges
        return tf.Lfm2Config(intermediate_size=128, num_key_value_heads=2,
                             layer_types=["conv", "full_attention"], **common)
    # Gated delta-rule linear attention (its chunked form solves triangular
    # systems) beside full attention; its cache holds LinearAttentionLayer state.
    if family == "qwen3_next":
        return tf.Qwen3NextConfig(intermediate_size=128, moe_intermediate_size=32,
                                  shared_expert_intermediate_size=32, num_experts=4,
                                  num_experts_per_tok=2, head_dim=16, num_key_value_heads=2,
                                  layer_types=["linear_attention", "full_attention"],
                                  linear_num_value_heads=4, linear_num_key_heads=2,
                                  linear_key_head_dim=16, linear_value_head_dim=16, **common)
    # Its recurrent layers keep their state as module attributes, set by every call.
    if family == "recurrent_gemma":
        return tf.RecurrentGemmaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                                       num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=1, lru_width=64,
                                       attention_window_size=8,
                                       block_types=["recurrent", "attention"], pad_token_id=0,
                                       eos_token_id=None, bos_token_id=1)
    # Position tables looked up by per-row positions: GPT-J gathers from a
    # table repeated per row, XGLM selects from a sinusoidal one, DeepSeek-V2
    # rotates by complex numbers (polar, view_as_complex).
    if family == "gptj":
        return tf.GPTJConfig(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                             rotary_dim=8, pad_token_id=0, eos_token_id=None, bos_token_id=1)
    if family == "xglm":
        return tf.XGLMConfig(vocab_size=VOCAB, d_model=64, num_layers=2, attention_heads=4,
                             ffn_dim=128, max_position_embeddings=64, pad_token_id=0,
                             eos_token_id=None, bos_token_id=1, decoder_start_token_id=2)
    if family == "deepseek_v2":
        return tf.DeepseekV2Config(intermediate_size=128, moe_intermediate_size=32,
                                   n_routed_experts=4, num_experts_per_tok=2, n_group=1,
                                   topk_group=1, first_k_dense_replace=1, kv_lora_rank=16,
                                   q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8,
                                   v_head_dim=16, num_key_value_heads=2, **common)
    # More decoders, split and compared as they are (hf_apply_test's
    # MORE_FAMILIES): a mixture of experts with a shared expert, fused QKV,
    # sliding layers with a local rotary table, ALiBi biases (Bloom: one per
    # row and head, rows times heads in its first dimension; MPT), a parallel
    # residual with partial rotary, positions from the attention mask's
    # cumulative sum (OPT).
    if family == "qwen2_moe":
        return tf.Qwen2MoeConfig(intermediate_size=128, moe_intermediate_size=32,
                                 shared_expert_intermediate_size=32, num_experts=4,
                                 num_experts_per_tok=2, num_key_value_heads=2, **common)
    if family == "phi3":
        return tf.Phi3Config(intermediate_size=128, num_key_value_heads=2, **common)
    if family == "gemma3":
        return tf.Gemma3TextConfig(intermediate_size=128, num_key_value_heads=2, head_dim=16,
                                   sliding_window=8, **common)
    if family == "bloom":
        return tf.BloomConfig(vocab_size=VOCAB, hidden_size=64, n_layer=2, n_head=4,
                              pad_token_id=0, eos_token_id=None, bos_token_id=1)
    if family == "mpt":
        return tf.MptConfig(vocab_size=VOCAB, d_model=64, n_layers=2, n_heads=4, max_seq_len=64,
                            pad_token_id=0, eos_token_id=None, bos_token_id=1)
    if family == "gpt_neox":
        return tf.GPTNeoXConfig(intermediate_size=128, **common)
    if family == "opt":
        return tf.OPTConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                            num_attention_heads=4, ffn_dim=128, max_position_embeddings=64,
                            word_embed_proj_dim=64, pad_token_id=0, eos_token_id=None,
                            bos_token_id=1)
    # Encoder-decoders: their decoders build an EncoderDecoderCache (self- and
    # cross-attention); T5's encoder and decoder are one class, T5Stack.
    if family == "t5":
        return tf.T5Config(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2,
                           num_decoder_layers=2, num_heads=4, pad_token_id=0, eos_token_id=None,
                           decoder_start_token_id=0)
    if family == "bart":
        return tf.BartConfig(vocab_size=VOCAB, d_model=64, encoder_layers=2, decoder_layers=2,
                             encoder_attention_heads=4, decoder_attention_heads=4,
                             encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=64,
                             pad_token_id=0, eos_token_id=None, bos_token_id=1,
                             decoder_start_token_id=2, forced_eos_token_id=None)
    raise SystemExit(f"unknown family {family}")


def build(family):
    torch.manual_seed(0)
    config = tiny_config(family)
    auto = tf.AutoModelForSeq2SeqLM if config.is_encoder_decoder else tf.AutoModelForCausalLM
    return auto.from_config(config).eval()


DEVICE = "cpu"


def prompts():
    g = torch.Generator().manual_seed(1)
    return torch.randint(2, VOCAB, (BATCH, PROMPT), generator=g).to(DEVICE)


def greedy(model, **kwargs):
    kwargs.setdefault("do_sample", False)
    out = model.generate(**kwargs, max_new_tokens=NEW_TOKENS, output_logits=True,
                         return_dict_in_generate=True)
    return {"tokens": out.sequences, "logits": [t.float() for t in out.logits]}


def pattern_forward(model, ids):
    """model(ids) with the library's defaults (a DynamicCache is made)."""
    logits = model(ids).logits
    return {"tokens": logits.argmax(-1), "logits": [logits.float()]}


def pattern_no_cache(model, ids):
    """model(ids, use_cache=False): a scoring or evaluation forward that
    builds no cache."""
    logits = model(ids, use_cache=False).logits
    return {"tokens": logits.argmax(-1), "logits": [logits.float()]}


def pattern_decode_loop(model, ids):
    """A manual greedy decode loop that passes past_key_values back in."""
    out = model(ids, use_cache=True)
    logits, cache = [out.logits[:, -1]], out.past_key_values
    tokens = [ids]
    nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    for _ in range(NEW_TOKENS):
        tokens.append(nxt)
        out = model(nxt, past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        logits.append(out.logits[:, -1])
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    return {"tokens": torch.cat(tokens, 1), "logits": [t.float() for t in logits]}


def pattern_generate(model, ids):
    return greedy(model, input_ids=ids, attention_mask=torch.ones_like(ids))


def pattern_beam_search(model, ids):
    """generate() with 2 beams and 2 sequences returned each, and sampling:
    the batch is rows x beams, and between steps the generation loop reorders
    the cache's rows by beam (outside the stack), and draws tokens."""
    beams = greedy(model, input_ids=ids, attention_mask=torch.ones_like(ids), num_beams=2,
                   num_return_sequences=2)
    torch.manual_seed(5)
    sampled = greedy(model, input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True,
                     top_k=20)
    return {"tokens": torch.cat([beams["tokens"], sampled["tokens"]]),
            "logits": beams["logits"] + sampled["logits"]}


def pattern_static_cache(model, ids):
    return greedy(model, input_ids=ids, attention_mask=torch.ones_like(ids),
                  cache_implementation="static")


def auto_compiled(fullgraph):
    """generate() with a static cache, which compiles the model's forward
    for its decode steps (transformers' auto-compile: on a GPU by default,
    here asked for on every device), with the eager backend."""
    def pattern(model, ids):
        import torch._dynamo

        config = tf.CompileConfig(backend="eager", mode=None, fullgraph=fullgraph)
        config._compile_all_devices = True
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        out = greedy(model, input_ids=ids, attention_mask=torch.ones_like(ids),
                     cache_implementation="static", compile_config=config)
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs
        print(f"auto-compile: dynamo compiled {graphs} graphs", flush=True)
        return out
    return pattern


def pattern_continuous_batching(model, ids):
    """generate_batch(): transformers' continuous batching, which packs the
    requests' tokens into one row over a paged cache. No logits."""
    config = tf.GenerationConfig(max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=-1,
                                 pad_token_id=0)
    out = model.generate_batch(inputs=[row.tolist() for row in ids], generation_config=config)
    tokens = [out[f"req_{i}"].generated_tokens for i in range(len(ids))]
    return {"tokens": torch.cat([ids, torch.tensor(tokens)], 1), "logits": []}


def pattern_left_padding(model, ids):
    ids = ids.clone()
    mask = torch.ones_like(ids)
    for row in range(BATCH):  # row r has r padding tokens on the left
        ids[row, :row] = 0
        mask[row, :row] = 0
    return greedy(model, input_ids=ids, attention_mask=mask)


def pattern_next_turn(model, ids):
    """A conversation's second turn: generate() again on the first turn's
    sequences and new tokens, reusing the first turn's cache (generate()
    marks a cache passed in as the caller's)."""
    first = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                           max_new_tokens=NEW_TOKENS, do_sample=False,
                           return_dict_in_generate=True)
    more = torch.randint(2, VOCAB, (BATCH, 3), generator=torch.Generator().manual_seed(7))
    ids = torch.cat([first.sequences, more.to(ids.device)], 1)
    return greedy(model, input_ids=ids, attention_mask=torch.ones_like(ids),
                  past_key_values=first.past_key_values)


def pattern_outputs(model, ids):
    """model(ids) asked for every layer's hidden states and attention weights
    (eager attention, which returns them): transformers 5 collects them with
    hooks on the layers and their attention modules."""
    before = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        out = model(ids, output_hidden_states=True, output_attentions=True)
    finally:
        model.set_attn_implementation(before)
    assert len(out.attentions) == model.config.num_hidden_layers, len(out.attentions)
    return {"tokens": out.logits.argmax(-1),
            "logits": [t.float() for t in (out.logits, *out.hidden_states, *out.attentions)]}


PATTERNS = {
    "forward": pattern_forward,
    "decode_loop": pattern_decode_loop,
    "generate": pattern_generate,
    "static_cache": pattern_static_cache,
    "left_padding": pattern_left_padding,
}
def pattern_router_logits(model, ids):
    """A mixture-of-experts model asked for its router logits, as training
    with the load-balancing loss does: one tensor per layer of
    [batch x tokens, experts], and the auxiliary loss computed from them."""
    out = model(ids, labels=ids, output_router_logits=True)
    assert len(out.router_logits) == model.config.num_hidden_layers, len(out.router_logits)
    return {"tokens": out.logits.argmax(-1),
            "logits": [t.float() for t in (out.logits, out.loss.reshape(1),
                                           out.aux_loss.reshape(1), *out.router_logits)]}


def pattern_labels(model, ids):
    """An encoder-decoder's forward with labels, as its training loop and its
    evaluation call it: the decoder's inputs are the labels shifted right,
    and the decoder builds its EncoderDecoderCache (use_cache defaults on)."""
    labels = torch.randint(2, VOCAB, (BATCH, 6), generator=torch.Generator().manual_seed(2))
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels.to(ids.device))
    return {"tokens": out.logits.argmax(-1),
            "logits": [out.logits.float(), out.loss.float().reshape(1),
                       out.encoder_last_hidden_state.float()]}


def pattern_passed_cache(model, ids):
    """generate() on a cache its caller made and passed (an encoder-decoder's
    EncoderDecoderCache), which generate() marks as the caller's."""
    config = model.config
    cache = tf.DynamicCache(config=config)
    if config.is_encoder_decoder:
        cache = tf.EncoderDecoderCache(cache, tf.DynamicCache(config=config))
    return greedy(model, input_ids=ids, attention_mask=torch.ones_like(ids),
                  past_key_values=cache)


def pattern_train(model, ids):
    """A training step as fine-tuning runs it: train mode (the config's
    dropout active, where it has one), the inputs as labels, the loss's
    gradients. Seeded, so that two runs draw the same dropout masks."""
    model.train()
    try:
        torch.manual_seed(5)
        model.zero_grad()
        with torch.enable_grad():
            out = model(ids, labels=ids)
            out.loss.backward()
    finally:
        model.eval()
    grads = [p.grad.float() for p in model.parameters() if p.grad is not None]
    return {"tokens": out.logits.argmax(-1),
            "logits": [out.logits.detach().float(), out.loss.detach().reshape(1), *grads]}


# Run only when named (not in "all").
EXTRA_PATTERNS = {"outputs": pattern_outputs, "router_logits": pattern_router_logits,
                  "train": pattern_train, "next_turn": pattern_next_turn,
                  "labels": pattern_labels, "passed_cache": pattern_passed_cache,
                  "no_cache": pattern_no_cache, "beam_search": pattern_beam_search,
                  "continuous_batching": pattern_continuous_batching,
                  "auto_compile": auto_compiled(False),
                  "auto_compile_fullgraph": auto_compiled(True)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", required=True)
    ap.add_argument("--patterns", default="all",
                    help="comma-separated; all: every pattern but outputs")
    ap.add_argument("--out")
    ap.add_argument("--apply", help="a plan to apply in process with dynaflow.apply")
    ap.add_argument("--compile", nargs="?", const="graph-breaks",
                    choices=["graph-breaks", "fullgraph"],
                    help="torch.compile the model (fullgraph: with fullgraph=True)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (float32 either way)")
    ap.add_argument("--outputs-first", action="store_true",
                    help="call the model once with every output asked for before applying")
    ap.add_argument("--inference-mode", action="store_true",
                    help="run under torch.inference_mode() instead of torch.no_grad()")
    ap.add_argument("--warmup", action="store_true",
                    help="run the patterns once before the run that is recorded (under "
                         "dynaflow apply, the first call of each kind runs the original way)")
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    model = build(args.family).to(DEVICE)
    if args.outputs_first:  # transformers installs its output-capturing hooks
        with torch.no_grad():
            pattern_outputs(model, prompts())
    if args.apply:
        import dynaflow
        model = dynaflow.apply(model, args.apply)
    if args.compile:
        model = torch.compile(model, backend="eager", fullgraph=args.compile == "fullgraph")
    names = list(PATTERNS) if args.patterns == "all" else args.patterns.split(",")
    results = {}
    with torch.inference_mode() if args.inference_mode else torch.no_grad():
        for name in names if args.warmup else []:
            {**PATTERNS, **EXTRA_PATTERNS}[name](model, prompts())
        for name in names:
            r = {**PATTERNS, **EXTRA_PATTERNS}[name](model, prompts())
            results[name] = {"tokens": r["tokens"].cpu(), "logits": [t.cpu() for t in r["logits"]]}
            print(f"{name}: tokens {results[name]['tokens'][:, -NEW_TOKENS:].tolist()}",
                  flush=True)
    if args.apply:
        a = model._dynaflow_applier.report
        print(f"in-process: {a.planned_calls} planned and {a.original_calls} original calls",
              flush=True)
        for path, r in a.regions.items():  # [segment, micro-batch, stream] in turn order
            print(f"in-process: {path} ran {r['calls']} calls, {r['off_schedule_calls']} off "
                  f"schedule, executed {r['executed']}", flush=True)
    if args.out:
        torch.save(results, args.out)


if __name__ == "__main__":
    sys.exit(main())
