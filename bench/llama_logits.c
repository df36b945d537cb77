/* Logits of every position of one token sequence, from llama.cpp's own library: the peer that
 * bench/moe_parity.py compares inferno with on the same GGUF. Built by that script against the
 * vendored llama.cpp of ../shared/bin/llama-server.sh (no llama-cpp-python needed). K and V
 * stay float32, as in inferno's uncached forward, so that only the matrix arithmetic differs.
 *
 *     llama_logits MODEL.gguf OUT.f32 ID ID ID ...     # OUT: float32 [n_ids, n_vocab]
 */
#include <stdio.h>
#include <stdlib.h>

#include "llama.h"

int main(int argc, char ** argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL.gguf OUT.f32 ID...\n", argv[0]);
        return 2;
    }
    int n = argc - 3;
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    struct llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n + 16;
    cp.n_batch = cp.n_ubatch = n;
    cp.n_threads = cp.n_threads_batch = 2;
    cp.type_k = cp.type_v = GGML_TYPE_F32;  /* float32 K/V, as inferno's uncached logits */
    struct llama_context * ctx = llama_init_from_model(model, cp);
    struct llama_batch batch = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        batch.token[i] = atoi(argv[3 + i]);
        batch.pos[i] = i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = 1;  /* every position's logits */
    }
    batch.n_tokens = n;
    if (llama_decode(ctx, batch) != 0) {
        fprintf(stderr, "llama_decode failed\n");
        return 1;
    }
    int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    FILE * out = fopen(argv[2], "wb");
    for (int i = 0; i < n; i++) {
        fwrite(llama_get_logits_ith(ctx, i), sizeof(float), n_vocab, out);
    }
    fclose(out);
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
