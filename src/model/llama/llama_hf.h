/* model/llama_hf: Hugging Face LlamaForCausalLM interop — tensor names, the RoPE row
 * permutation, config.json, and reading an HF folder into ctitan's parameter layout.
 *
 * RoPE: ctitan (like Meta and TorchTitan) rotates interleaved pairs (x[2i], x[2i+1]); Hugging
 * Face rotates halves (x[i], x[i + D/2]). Permuting the rows of each head of wq and wk (HF
 * row j*D/2 + i = ctitan row 2i + j) makes the two forwards equal; importing applies the
 * inverse, so export then import is the identity, bit for bit.
 */
#ifndef CT_MODEL_LLAMA_HF_H
#define CT_MODEL_LLAMA_HF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/llama/llama.h"
#include "model/model_hf.h"

/* ctitan (TorchTitan) name -> Hugging Face name; false for an unknown name. */
bool llama_hf_name(const char *name, char *out, size_t n);

/* The number of heads whose rows a tensor holds when it needs the RoPE row permutation
 * (model_hf_permute_rope_rows), else 0. */
int64_t llama_hf_rope_heads(const struct llama_config *c, const char *name);

/* config.json text (malloc'd). */
char *llama_hf_config_json(const struct llama_config *c);

/* Read an HF folder (config.json, and model.safetensors or model.safetensors.index.json with
 * its shards) into params (table layout, whole model). The config must describe this model
 * (errors name the key); every tensor must be present as F32 or BF16 with the right
 * shape (errors name the file and tensor). A missing lm_head with
 * tie_word_embeddings copies the embedding. */
int llama_hf_load(const char *dir, const struct llama_config *c, const struct param_table *t,
                  float *params);

/* The family's entry (model_family.hf): the above through the model interface. */
extern const struct model_hf_ops llama_hf_ops;

#endif
