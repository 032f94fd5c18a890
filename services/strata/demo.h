/* demo.h - the embedded demo: a tiny Mixtral-shaped model with RANDOM weights, generated
 * locally (no download), and the default config `strata up --demo` runs it with.
 *
 * demo_model_write(dir) writes two folders:
 *   dir/hf/     an HF checkpoint folder: config.json (MixtralForCausalLM), model.safetensors
 *               (bf16, transformers tensor names), tokenizer.json (byte-level BPE: 256 byte
 *               tokens, DEMO_MERGES merges, <s> and </s>; vocab == the model's vocab_size)
 *   dir/model/  the same model packed with the pack library (bf16, 2 MiB expert blocks), so
 *               both folders give identical outputs.
 * Each folder is written under a temporary name and renamed into place when complete.
 * The weights are plainly random: the text it produces is gibberish by construction.
 */
#ifndef STRATA_DEMO_H
#define STRATA_DEMO_H

#include <stdint.h>

#include "common/strata.h"

#define DEMO_SEED 20241129u
#define DEMO_MERGES 30
#define DEMO_VOCAB (256 + DEMO_MERGES + 2) /* bytes + merges + <s> + </s> */
#define DEMO_HIDDEN 64
#define DEMO_LAYERS 2
#define DEMO_HEADS 4
#define DEMO_KV_HEADS 2
#define DEMO_HEAD_DIM 16
#define DEMO_INTER 128
#define DEMO_EXPERTS 4
#define DEMO_TOP_K 2
#define DEMO_CONTEXT 512

/* Write dir/hf and dir/model (see above) unless dir/model already holds a packed model.
 * Returns 0 or <0 with eb naming the file. */
int demo_model_write(const char *dir, uint64_t seed, strata_errbuf_t *eb);

/* Write only the byte-level BPE tokenizer.json of the demo to path. */
int demo_tokenizer_write(const char *path, strata_errbuf_t *eb);

/* Write the demo group config to path: group `name`, run_dir, model = model_dir, the default
 * client endpoint tcp://127.0.0.1:<port>, no cpu pinning (runs on any machine). */
int demo_config_write(const char *path, const char *name, const char *run_dir, const char *model_dir, int port,
                      strata_errbuf_t *eb);

#endif
