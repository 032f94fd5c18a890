/* demo.h - the demo: a small Mixtral-shaped MoE trained on English (models/demo: its training
 * script, corpus source and licence are there), and the default config `strata up --demo`
 * runs it with.
 *
 * The model ships as an HF folder, found by demo_model_find. demo_model_write(dir) writes:
 *   dir/hf/     a copy of that folder (config.json, model.safetensors in bf16, tokenizer.json,
 *               tokenizer_config.json, ...)
 *   dir/model/  the same model packed with the pack library (bf16, lossless), so both folders
 *               give identical outputs.
 * Each folder is written under a temporary name and renamed into place when complete.
 */
#ifndef STRATA_DEMO_H
#define STRATA_DEMO_H

#include <stddef.h>

#include "common/strata.h"

/* Find the shipped demo model folder: $STRATA_DEMO_MODEL, else share/strata/demo-model beside
 * the running binary's bin/ folder (an install or a bundle), else the source tree's models/demo,
 * else the configured install folder. Writes its real path to out. Returns 0 or <0 with eb
 * listing where it looked. */
int demo_model_find(char *out, size_t cap, strata_errbuf_t *eb);

/* Write dir/hf and dir/model (see above) unless dir/model already holds a packed model.
 * Returns 0 or <0 with eb naming the file. */
int demo_model_write(const char *dir, strata_errbuf_t *eb);

/* Write the demo group config to path: group `name`, run_dir, model = model_dir, the default
 * client endpoint tcp://127.0.0.1:<port>, no cpu pinning (runs on any machine). */
int demo_config_write(const char *path, const char *name, const char *run_dir, const char *model_dir, int port,
                      strata_errbuf_t *eb);

#endif
