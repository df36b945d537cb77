/* Logits of every position of one token sequence, from llama.cpp's own library: the peer that
 * bench/moe_parity.py compares inferno with on the same GGUF. Built by that script against the
 * vendored llama.cpp of ../shared/bin/llama-server.sh (no llama-cpp-python needed). K and V
 * stay float32, as in inferno's uncached forward, so that only the matrix arithmetic differs.
 *
 *     llama_logits MODEL.gguf OUT.f32 ID ID ID ...     # OUT: float32 [n_ids, n_vocab]
 *
 * LLAMA_UBATCH=N splits the sequence into llama.cpp's micro-batches of N tokens (1: each token
 * through its decode kernels). With LLAMA_ROUTING=FILE set, a mixture of experts' routing goes there too: for each layer's
 * "ffn_moe_topk" tensor as llama.cpp computes it, int32 layer, n_used, n_tokens, then the
 * chosen experts [n_tokens][n_used], best first.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

static bool routing(struct ggml_tensor * t, bool ask, void * user_data) {
    if (strncmp(t->name, "ffn_moe_topk-", 13) != 0) {
        return ask ? false : true;
    }
    if (ask) {
        return true;
    }
    FILE * f = user_data;
    int head[3] = {atoi(t->name + 13), (int) t->ne[0], (int) t->ne[1]};
    fwrite(head, sizeof(int), 3, f);
    for (int j = 0; j < t->ne[1]; j++) {  /* a view of argsort's rows: rows nb[1] bytes apart */
        fwrite((const char *) t->data + j * t->nb[1], sizeof(int), t->ne[0], f);
    }
    return true;
}

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
    if (getenv("LLAMA_UBATCH")) {  /* e.g. 1: token by token, llama.cpp's decode kernels */
        cp.n_ubatch = atoi(getenv("LLAMA_UBATCH"));
    }
    cp.n_threads = cp.n_threads_batch = 2;
    cp.type_k = cp.type_v = GGML_TYPE_F32;  /* float32 K/V, as inferno's uncached logits */
    FILE * route = getenv("LLAMA_ROUTING") ? fopen(getenv("LLAMA_ROUTING"), "wb") : NULL;
    if (route) {
        cp.cb_eval = routing;
        cp.cb_eval_user_data = route;
    }
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
    if (route) {
        fclose(route);
    }
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
