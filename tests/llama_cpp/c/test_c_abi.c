/* The C ABI from C (compiled as C99): attach, decode, read the statistics,
 * detach; bad options and calls out of order return a status and a message,
 * never abort. The model is the argument: a random MoE GGUF the CTest
 * fixture writes (the lab's moe-lab-model). Exit 0 on success. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"
#include "moe_residency/c/moe_residency.h"

static int failures = 0;
#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                              \
    }                                                                          \
  } while (0)
#define CHECK_MESSAGE(text)                                                                                           \
  do {                                                                                                                \
    if (strstr(moe_residency_last_error(), (text)) == NULL) {                                                         \
      fprintf(stderr, "%s:%d: last error '%s' lacks '%s'\n", __FILE__, __LINE__, moe_residency_last_error(), (text)); \
      ++failures;                                                                                                     \
    }                                                                                                                 \
  } while (0)

static void quiet(enum ggml_log_level level, const char* text, void* user) {
  (void)user;
  if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

/* Decodes 4 prompt tokens and 8 greedy ones; writes the 8 tokens. */
static int generate(struct llama_context* ctx, const struct llama_model* model, moe_residency_manager* r,
                    llama_token* out) {
  llama_token prompt[4] = {5, 17, 42, 99};
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  int i, j;
  if (llama_decode(ctx, llama_batch_get_one(prompt, 4)) != 0) return 0;
  if (r) moe_residency_settle(r);
  for (i = 0; i < 8; ++i) {
    const float* lg = llama_get_logits_ith(ctx, -1);
    llama_token best = 0;
    for (j = 1; j < n_vocab; ++j)
      if (lg[j] > lg[best]) best = j;
    out[i] = best;
    if (llama_decode(ctx, llama_batch_get_one(&out[i], 1)) != 0) return 0;
    if (r) moe_residency_settle(r);
  }
  return 1;
}

int main(int argc, char** argv) {
  struct llama_model_params mp;
  struct llama_context_params cp;
  struct llama_model* model;
  struct llama_context* ctx;
  moe_residency_options o;
  moe_residency_manager* r = NULL;
  moe_residency_stats s;
  llama_token stock[8], managed[8];
  if (argc != 2) {
    fprintf(stderr, "usage: test_c_abi MODEL.gguf\n");
    return 2;
  }
  llama_log_set(quiet, NULL);
  llama_backend_init();
  mp = llama_model_default_params();
  mp.load_mode = LLAMA_LOAD_MODE_MMAP;
  mp.use_extra_bufts = 0;
  model = llama_model_load_from_file(argv[1], mp);
  if (model == NULL) {
    fprintf(stderr, "cannot load %s\n", argv[1]);
    return 2;
  }

  /* Stock, for the tokens the manager must not change. */
  cp = llama_context_default_params();
  cp.n_ctx = 64;
  cp.n_threads = cp.n_threads_batch = 1;
  ctx = llama_init_from_model(model, cp);
  CHECK(ctx != NULL && generate(ctx, model, NULL, stock));
  llama_free(ctx);

  /* Bad options and arguments: a status and a message naming the option. */
  moe_residency_options_default(&o);
  o.lanes = 0;
  CHECK(moe_residency_attach(model, argv[1], &o, &cp, &r) == MOE_RESIDENCY_INVALID_ARGUMENT);
  CHECK(r == NULL);
  CHECK_MESSAGE("options.lanes = 0; expected at least 1 read lane");
  moe_residency_options_default(&o);
  o.exact = 7;
  CHECK(moe_residency_attach(model, argv[1], &o, &cp, &r) == MOE_RESIDENCY_INVALID_ARGUMENT);
  CHECK_MESSAGE("options.exact = 7; expected 0 or 1");
  moe_residency_options_default(&o);
  o.cache = 0;
  o.cache_budget_bytes = 1 << 20;
  CHECK(moe_residency_attach(model, argv[1], &o, &cp, &r) == MOE_RESIDENCY_INVALID_ARGUMENT);
  CHECK_MESSAGE("but options.cache = 0");
  moe_residency_options_default(&o);
  o.cache = 0;
  o.pool = 1;
  CHECK(moe_residency_attach(model, argv[1], &o, &cp, &r) == MOE_RESIDENCY_INVALID_ARGUMENT);
  CHECK_MESSAGE("pool holds the cache's experts; expected cache = true with pool");
  CHECK(moe_residency_attach(model, "no-such-model.gguf", NULL, &cp, &r) == MOE_RESIDENCY_REFUSED);
  CHECK_MESSAGE("no-such-model.gguf");
  CHECK(moe_residency_attach(NULL, argv[1], NULL, &cp, &r) == MOE_RESIDENCY_INVALID_ARGUMENT);
  CHECK_MESSAGE("model is null");
  CHECK(moe_residency_start(NULL, NULL) == MOE_RESIDENCY_INVALID_ARGUMENT);
  CHECK(moe_residency_get_stats(NULL, &s) == MOE_RESIDENCY_INVALID_ARGUMENT);
  moe_residency_detach(NULL); /* a no-op */

  /* Attach, start, decode, read the statistics, detach. The model fits: act anyway.
     Twice: the cache's experts locked in the page cache, then in the expert pool. */
  for (int pool = 0; pool <= 1; ++pool) {
    moe_residency_options_default(&o);
    o.pool = pool;
    o.act_when_fits = 1;
    o.measure = 1; /* the routed experts' residency at routing: routed_experts below */
    o.cache_budget_bytes = 4u << 20;
    cp = llama_context_default_params();
    cp.n_ctx = 64;
    cp.n_threads = cp.n_threads_batch = 1;
    CHECK(moe_residency_attach(model, argv[1], &o, &cp, &r) == MOE_RESIDENCY_OK);
    CHECK(strcmp(moe_residency_last_error(), "") == 0);
    CHECK(r != NULL);
    ctx = llama_init_from_model(model, cp);
    CHECK(ctx != NULL);
    if (moe_residency_start(r, ctx) != MOE_RESIDENCY_OK) {
      fprintf(stderr, "start: %s\n", moe_residency_last_error());
      ++failures;
    }
    CHECK(moe_residency_start(r, ctx) == MOE_RESIDENCY_BAD_STATE);
    CHECK_MESSAGE("already started");
    CHECK(generate(ctx, model, r, managed));
    CHECK(memcmp(stock, managed, sizeof stock) == 0); /* the same tokens */
    CHECK(moe_residency_get_stats(r, &s) == MOE_RESIDENCY_OK);
    CHECK(s.active == 1);
    CHECK(s.standing_down == 0);
    CHECK(s.routed_experts > 0);
    CHECK(s.exact_reads > 0 || s.cache_hits > 0);
    CHECK(s.dense_bytes > 0);
    CHECK(s.budget_bytes == 4u << 20);
    CHECK(s.pinned_bytes > 0 && s.pinned_bytes <= s.budget_bytes);
    CHECK(s.advice_errors == 0);
    CHECK(strstr(moe_residency_summary(r), "residency") != NULL);
    CHECK(!pool || strstr(moe_residency_summary(r), "in a pool of") != NULL); /* the experts went to the pool */
    printf("%s\n", moe_residency_summary(r));
    llama_free(ctx);
    moe_residency_detach(r);
  }

  llama_model_free(model);
  llama_backend_free();
  if (failures) fprintf(stderr, "test_c_abi: %d checks failed\n", failures);
  else printf("test_c_abi: every check passed\n");
  return failures ? 1 : 0;
}
