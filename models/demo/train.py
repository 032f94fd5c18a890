#!/usr/bin/env python3
"""Train the demo model: a small Mixtral-shaped MoE (8 experts, top-2) and its byte-level BPE
tokenizer, on the fortunes corpus that make_corpus.py writes. Run on a machine with torch,
transformers and tokenizers (a GPU takes a few minutes; the seed fixes everything but the
GPU's own nondeterminism):

    python3 train.py --corpus corpus.txt --out DIR [--steps N] [--max-minutes M]

DIR receives an HF folder that `strata pack` and transformers both load: config.json,
model.safetensors (bf16), tokenizer.json, tokenizer_config.json, generation_config.json, plus
train.log (the loss curve) and samples.json (transformers' greedy continuations of the
PROMPTS below, reloaded from the saved folder in fp32).
"""
import argparse
import json
import math
import os
import sys
import time

# the first five are the ones tests/demo checks; the rest widen the look at the samples
PROMPTS = ["Once upon a time", "The capital of France is", "The best way to learn is",
           "A friend is someone who", "In the beginning", "My favorite food is", "The old man said",
           "Life is", "When I was young", "The secret of success is"]
SEQ = 256
BATCH = 64


def log(f, msg):
    print(msg, flush=True)
    f.write(msg + "\n")
    f.flush()


def train_tokenizer(text, vocab):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(text.split("\n\n"), trainer=trainer)
    return tok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--max-minutes", type=float, default=6.0, help="stop early after this long (logged)")
    ap.add_argument("--seed", type=int, default=20261202)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--vocab", type=int, default=8192, help="BPE vocabulary")
    ap.add_argument("--inter", type=int, default=192, help="each expert's intermediate size")
    a = ap.parse_args()

    import torch
    import transformers
    import tokenizers
    from transformers import MixtralConfig, MixtralForCausalLM, PreTrainedTokenizerFast

    os.makedirs(a.out, exist_ok=True)
    lf = open(os.path.join(a.out, "train.log"), "w")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    log(lf, "torch %s, transformers %s, tokenizers %s, device %s%s" % (
        torch.__version__, transformers.__version__, tokenizers.__version__, dev,
        " (%s)" % torch.cuda.get_device_name(0) if dev == "cuda" else ""))
    text = open(a.corpus).read()
    log(lf, "corpus %s: %d bytes" % (a.corpus, len(text)))
    log(lf, "settings: steps %d, vocab %d, inter %d, seed %d, lr %g" % (a.steps, a.vocab, a.inter, a.seed, a.lr))

    t0 = time.time()
    tok = train_tokenizer(text, a.vocab)
    tok.save(os.path.join(a.out, "tokenizer.json"))
    ids = torch.tensor(tok.encode(text).ids, dtype=torch.long)
    log(lf, "tokenizer: byte-level BPE, vocab %d, corpus %d tokens (%.2f bytes/token), %.1f s" % (
        tok.get_vocab_size(), len(ids), len(text) / len(ids), time.time() - t0))
    hf_tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(a.out, "tokenizer.json"), unk_token="<unk>",
                                     bos_token="<s>", eos_token="</s>", model_max_length=1024)
    hf_tok.save_pretrained(a.out)

    torch.manual_seed(a.seed)
    cfg = MixtralConfig(vocab_size=a.vocab, hidden_size=256, intermediate_size=a.inter, num_hidden_layers=4,
                        num_attention_heads=8, num_key_value_heads=4, head_dim=32, hidden_act="silu",
                        max_position_embeddings=1024, rms_norm_eps=1e-5, rope_theta=10000.0,
                        num_local_experts=8, num_experts_per_tok=2, router_aux_loss_coef=0.02,
                        output_router_logits=True, tie_word_embeddings=False, sliding_window=None,
                        bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = MixtralForCausalLM(cfg).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    log(lf, "model: Mixtral, %d layers, hidden %d, %d experts of %d, top-%d, %.2f M parameters" % (
        cfg.num_hidden_layers, cfg.hidden_size, cfg.num_local_experts, cfg.intermediate_size,
        cfg.num_experts_per_tok, n_params / 1e6))
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1)
    warm = 100

    def lr_at(s):
        if s < warm:
            return a.lr * (s + 1) / warm
        return a.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * (s - warm) / max(1, a.steps - warm))))

    g = torch.Generator().manual_seed(a.seed)
    ids_dev = ids.to(dev)
    model.train()
    t0 = time.time()
    step = 0
    for step in range(a.steps):
        for grp in opt.param_groups:
            grp["lr"] = lr_at(step)
        start = torch.randint(0, len(ids) - SEQ, (BATCH,), generator=g).to(dev)
        x = ids_dev[start[:, None] + torch.arange(SEQ, device=dev)[None, :]]
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=dev == "cuda"):
            out = model(input_ids=x, labels=x)  # the model shifts the labels itself
        loss = out.loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        el = time.time() - t0
        if step % 100 == 0 or step == a.steps - 1:
            log(lf, "step %5d  loss %.4f (aux %.4f)  lr %.2e  %.0f tok/s  %.1f s" % (
                step, loss.item(), out.aux_loss.item() if out.aux_loss is not None else 0.0, lr_at(step),
                (step + 1) * BATCH * SEQ / max(el, 1e-9), el))
        if el > a.max_minutes * 60:
            log(lf, "stopped after %d steps at the %.1f-minute limit" % (step + 1, a.max_minutes))
            break
    log(lf, "trained %d steps, %d tokens, %.1f s" % (step + 1, (step + 1) * BATCH * SEQ, time.time() - t0))

    model.config.output_router_logits = False
    model = model.to(torch.bfloat16)
    model.config.dtype = "bfloat16"
    model.save_pretrained(a.out, safe_serialization=True)
    st = os.path.getsize(os.path.join(a.out, "model.safetensors"))
    log(lf, "saved %s: model.safetensors %.1f MB (bf16)" % (a.out, st / 1e6))

    # transformers' greedy continuations of the fixed prompts, from the saved folder in fp32
    m2 = MixtralForCausalLM.from_pretrained(a.out, dtype=torch.float32).to(dev).eval()
    samples = []
    for p in PROMPTS:
        enc = hf_tok(p, return_tensors="pt").to(dev)
        with torch.no_grad():
            o = m2.generate(**enc, max_new_tokens=48, do_sample=False, pad_token_id=0)
        new = o[0, enc["input_ids"].shape[1]:].tolist()
        samples.append({"prompt": p, "prompt_tokens": enc["input_ids"][0].tolist(), "tokens": new,
                        "text": hf_tok.decode(new)})
        log(lf, "greedy: %r -> %r" % (p, samples[-1]["text"]))
    json.dump({"prompts": samples, "seed": a.seed, "steps": step + 1}, open(os.path.join(a.out, "samples.json"), "w"),
              indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
