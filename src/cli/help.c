/* `tern --version` and `tern SUBCOMMAND --help`: for each subcommand a
 * one-line description, its arguments and every option with its default.
 * The option lists here are the contract the subcommands' parsers follow
 * (tests/cli/test_cli_help.py checks both against each other). */
#include <stdio.h>
#include <string.h>

#include "cli.h"

#ifndef TERN_VERSION
#define TERN_VERSION "0.0.0"
#endif

typedef struct cli_help {
    const char *name, *synopsis, *what, *options;
} cli_help;

#define DEVICE_OPTS                                                                                  \
    "  --device cpu|cuda|cuda:N|auto  where the model runs (default: auto = the first GPU of a CUDA\n" \
    "                             build, else the CPU)\n"                                              \
    "  --exact-products           f32 activations for quantized weights (default: integer products)\n" \
    "  --kv-type f32|bf16|f16|q8|q4|r4|r3|f8 KV cache storage (default: run and serve f16 on the CPU,\n" \
    "                             bf16 on CUDA; logits and perplexity f32)\n"                            \
    "  --kv-type-layers SPEC      per-layer types, LAYERS=TYPE,... with LAYERS N, A-B, firstN or\n"    \
    "                             lastN, later items win (e.g. first2=bf16,last2=bf16; default: none)\n" \
    "  --kv-quant-start N         positions below N stay 16-bit in quantized layers (default: 0)\n"

#define EXPERT_OPTS                                                                                  \
    "  --experts-in host|disk     a mixture of experts' weights: read into memory at load (host), or\n" \
    "                             read from disk when picked, the recent ones kept (disk) (default:\n" \
    "                             mapped, paged by the kernel)\n"                                         \
    "  --expert-cache SIZE        disk: memory for recently used experts, e.g. 8G (default: half the\n" \
    "                             memory); the hit rate and GB/s read are logged at exit\n"

static const cli_help helps[] = {
    {"run", "tern run MODEL_DIR --prompt TEXT [OPTIONS]",
     "Generates text from one prompt, streaming only the new text to stdout.",
     "  -p, --prompt TEXT          the prompt (required)\n"
     "  -n, --max-tokens N         tokens to generate (default: 256)\n"
     "  --temperature T            sampling temperature, 0 = greedy (default: 0.8)\n"
     "  --top-p P                  nucleus sampling (default: 1.0, off)\n"
     "  --top-k K                  keep the K most likely tokens, 0 = all (default: 0)\n"
     "  --seed S                   sampling seed (default: from the clock)\n"
     "  -c, --ctx-size N           context in positions; above the model's maximum is an error\n"
     "                             (default: the model's maximum)\n"
     "  -t, --threads N            CPU threads (default: the physical cores)\n"
     "  --draft-model DIR          a small model of the same vocabulary for speculative decoding\n"
     "                             (default: none)\n"
     "  --num-draft-tokens K       tokens drafted per step (default: 4)\n"
     "  --spec ngram|draft         speculation source (default: draft when --draft-model is given)\n"
     DEVICE_OPTS
     EXPERT_OPTS
     "  -v, --verbose              token ids, speculation and timing on stderr (default: off)\n"},
    {"chat", "tern chat MODEL_DIR [OPTIONS]",
     "Chats with the model in the terminal: its chat template, streamed answers, the conversation kept.",
     "  -s, --system TEXT          the system prompt (default: none)\n"
     "  -n, --max-tokens N         tokens per answer at most, 0 = until the context is full (default: 1024)\n"
     "  --temperature T            sampling temperature, 0 = greedy (default: 0.7)\n"
     "  --top-p P                  nucleus sampling (default: 1.0, off)\n"
     "  --top-k K                  keep the K most likely tokens, 0 = all (default: 0)\n"
     "  --seed S                   sampling seed (default: from the clock)\n"
     "  --think on|off             the template's enable_thinking (default: the template's own)\n"
     "  --hide-thinking            do not print the thought of a thinking model (default: shown dimmed)\n"
     "  --color, --no-color        color and dim text (default: on a terminal, unless NO_COLOR is set)\n"
     "  -c, --ctx-size N           context in positions; above the model's maximum is an error\n"
     "                             (default: the model's maximum); the oldest exchanges are dropped\n"
     "                             when the conversation no longer fits\n"
     "  -t, --threads N            CPU threads (default: the physical cores)\n"
     "  --draft-model DIR          a small model of the same vocabulary for speculative decoding\n"
     "                             (default: none)\n"
     DEVICE_OPTS
     "  -v, --verbose              tokens, cache hits and speed per answer on stderr (default: off)\n"
     "commands: /reset, /undo, /system TEXT, /think on|off, /help, /exit; a line ending with \\ goes on;\n"
     "Ctrl-C stops an answer, Ctrl-D leaves\n"},
    {"logits", "tern logits MODEL_DIR (--prompt TEXT | --ids 1,2,3) [OPTIONS]",
     "One forward pass; prints the top-K logits at every position as JSON lines.",
     "  --prompt TEXT              text to tokenize, with the tokenizer's special tokens\n"
     "                             (required, or --ids)\n"
     "  --ids LIST                 token ids, comma-separated (required, or --prompt)\n"
     "  --top K                    logits printed per position (default: 5)\n"
     "  --lora DIR                 a PEFT LoRA adapter folder applied to the model (default: none)\n"
     "  -t, --threads N            CPU threads (default: the physical cores)\n"
     DEVICE_OPTS
     EXPERT_OPTS},
    {"perplexity", "tern perplexity MODEL_DIR --file TEXT [OPTIONS]",
     "Perplexity of a text file in chunks (llama-perplexity's method), or KL divergence against a saved run.",
     "  --file TEXT                the text (required)\n"
     "  -c, --ctx, --ctx-size N    tokens per chunk; above the model's maximum is an error (default: 512)\n"
     "  --chunks N                 chunks scored, 0 = all (default: 0)\n"
     "  --save-logits F            save the logits for a later --kl-base (default: none)\n"
     "  --kl-base F                KL divergence against logits saved by --save-logits (default: none)\n"
     "  -t, --threads N            CPU threads (default: the physical cores)\n"
     DEVICE_OPTS
     EXPERT_OPTS},
    {"convert", "tern convert IN_DIR OUT_DIR (--bits 4|8 | --fp8 | --merge-lora DIR) [OPTIONS]",
     "Writes an MLX affine-quantized or FP8 copy of a model folder, and/or one with a LoRA adapter merged in.",
     "  --bits 4|8                 bits per weight (one of --bits, --fp8, --merge-lora required)\n"
     "  --fp8                      decoder projections to FP8 E4M3 with 128x128 block scales, the hub's\n"
     "                             quant_method \"fp8\" layout (default: off; not with --bits)\n"
     "  --group-size 32|64|128     weights sharing one scale and bias; must divide a mixture's expert\n"
     "                             inputs (gpt-oss: 32 or 64) (default: 64)\n"
     "  --merge-lora DIR           a PEFT LoRA adapter baked into the weights (default: none)\n"},
    {"template", "tern template DIR [--jsonl] < request.json",
     "Renders the chat template of DIR for a chat request read from stdin.",
     "  --jsonl                    one request per input line, one rendering per output line (default: off)\n"},
    {"grammar", "tern grammar compile|check|masks|bench SPEC [OPTIONS]",
     "Compiles a JSON schema, EBNF grammar, regex or choice list; checks text against it; prints token masks.",
     "  compile SPEC               prints the grammar as EBNF\n"
     "  check SPEC --input FILE|-  exit 0 accepted, 1 rejected (saying where), 2 bad SPEC; - reads stdin,\n"
     "                             and a trailing newline is allowed\n"
     "  masks --tokenizer DIR SPEC --input FILE [--list] [--final]\n"
     "                             the allowed-token mask before each token of the input\n"
     "  bench --tokenizer DIR --data DIR [--limit N] [--match STR] [--jsonl [--slow-us N]]\n"
     "                             compile and mask timings over a folder of schemas (default limit: all;\n"
     "                             --match: only files whose name holds STR; --slow-us: a record per mask\n"
     "                             slower than N us in the --jsonl output)\n"
     "SPEC: --schema FILE | --ebnf FILE | --regex RE | --choice JSON_ARRAY | --json (any JSON value)\n"
     "  --any-whitespace=false     JSON without free whitespace (default: true)\n"
     "  --max-whitespace N|none    longest whitespace run in JSON (default: 20)\n"},
    {"tokenize", "tern tokenize DIR [OPTIONS] < text",
     "Prints the token ids of stdin as a JSON array.",
     "  --no-special               leave out the tokenizer's special tokens (default: added)\n"
     "  --jsonl                    each input line a JSON string, one array per line (default: off)\n"},
    {"detokenize", "tern detokenize DIR [OPTIONS] < ids.json",
     "Prints the text of a JSON array of token ids read from stdin.",
     "  --skip-special             leave out special tokens (default: kept)\n"
     "  --jsonl                    one array per input line, one JSON string per line (default: off)\n"},
    {"bench", "tern bench MODEL_DIR [OPTIONS]",
     "Benchmarks every serving feature on this machine and writes report.json, report.md and plots.",
     "  --draft DIR                a draft model: adds the draft-speculation cells (default: none)\n"
     "  --out DIR                  where the reports and plots go (default: bench-report)\n"
     "  --quick                    streams 1,8, warm cache without speculation only, 32 tokens\n"
     "                             (default: off, the full matrix)\n"
     "  --compare URL              the same load against another OpenAI-compatible server, e.g.\n"
     "                             http://127.0.0.1:8081 (default: none)\n"
     "  --streams LIST             concurrent streams per cell (default: 1,4,16,64; quick: 1,8)\n"
     "  --features LIST            of plain, json_schema, regex, choice (default: all four)\n"
     "  --kv-types LIST            KV cache types run as extra plain cells (default: all seven;\n"
     "                             quick: q8,q4 at the largest stream count; \"\" = none)\n"
     "  --requests N               requests per cell at least (default: 8, quick: 4; and 2 per\n"
     "                             stream, quick: 1)\n"
     "  --max-tokens N             tokens per plain request (default: 64, quick: 32; constrained\n"
     "                             requests end with their grammar, at most max(N, 64))\n"
     "  --num-draft-tokens K       tokens drafted per step (default: 4)\n"
     "  -t, --threads N            CPU threads (default: the physical cores)\n"
     DEVICE_OPTS},
    {"serve", "tern serve (MODEL_DIR | --models DIR | --model NAME=DIR ...) [OPTIONS]",
     "Serves a model, or a pool of models, over an OpenAI-compatible HTTP API, with a chat page at /.",
     "  --host H                   bind address (default: 127.0.0.1; beyond loopback, use --api-key)\n"
     "  --port P                   TCP port, 0 = any free one (default: 8080)\n"
     "  --api-key KEY              /v1 needs 'Authorization: Bearer KEY' or 'x-api-key: KEY' (default: none)\n"
     "  --metrics-key KEY          /stats and /metrics need this key (default: none, open)\n"
     "  --model-name NAME          the model id clients name (default: the folder's name)\n"
     "  --models DIR               serve every model folder in DIR, named by its folder; a request's\n"
     "                             \"model\" picks one, loaded on demand (docs/model-pool.md)\n"
     "                             (default: none, the one MODEL_DIR)\n"
     "  --model NAME=DIR           serve DIR as NAME (repeatable; with or beside --models) (default: none)\n"
     "  --max-memory GB            the pool's weights + KV budget; the least recently used idle\n"
     "                             model is evicted to make room (default: no limit)\n"
     "  --pin NAME                 keep NAME loaded from the start, never evicted (repeatable)\n"
     "                             (default: none)\n"
     "  --lora [BASE:]NAME=DIR     a PEFT LoRA adapter requests name as model NAME or BASE:NAME\n"
     "                             (repeatable; BASE: the first model; CPU only; default: none)\n"
     "  -c, --ctx-size N           context per sequence; above the model's maximum is an error\n"
     "                             (in a pool: capped at each model's maximum)\n"
     "                             (default: the model's maximum)\n"
     "  --kv-budget GB             KV cache memory, per model in a pool (default: half the free\n"
     "                             memory - in a pool at most 1 GB - and at most what max-batch\n"
     "                             full contexts need)\n"
     "  --kv-disk DIR              keep prefix-cache blocks evicted from memory in DIR, across\n"
     "                             restarts (default: none; CPU only)\n"
     "  --kv-disk-budget SIZE      disk the tier may use, e.g. 20G (default: 10G; per model)\n"
     "  --kv-disk-zstd LEVEL       compress block files with zstd at LEVEL 1-19 (default: 0, raw)\n"
     "  --max-batch N              sequences decoded together (default: 64)\n"
     "  --max-queue N              requests waiting beyond the batch before 429 (default: 1024)\n"
     "  --prefill-chunk N          prompt tokens per forward (default: 512)\n"
     "  --cors ORIGIN              CORS headers for this origin (default: none)\n"
     "  --timeout S                idle / slow-request timeout in seconds (default: 30)\n"
     "  --max-connections N        open connections, one thread each (default: 512)\n"
     "  --max-client-connections N  of one client address, 0 = no cap (default: max-connections / 2)\n"
     "  --header-deadline S        a request's headers must arrive within S s, 0 = none (default: 15)\n"
     "  --body-deadline S          its body within S s after the headers, 0 = none (default: 120)\n"
     "  --compile-threads N        grammar compile workers (default: 2)\n"
     "  --log-format text|json     log lines as text or one JSON object each; an access line per\n"
     "                             request either way (default: text)\n"
     "  -t, --threads N            CPU threads (default: the physical cores)\n"
     "  --grammar-fallback prompt|none  a grammar that cannot compile goes into the prompt with a\n"
     "                             Warning header instead of a 400 (default: none)\n"
     "  --tool-call-format hermes|llama3_json|mistral|json|none  (default: detected from the template)\n"
     "  --draft-model DIR          draft model for speculative decoding (default: none)\n"
     "  --num-draft-tokens K       tokens drafted per step (default: 4)\n"
     "  --spec ngram               n-gram speculation from the context (default: off)\n"
     "  --grammar-jump             emit grammar-forced text without sampling it (default: off)\n"
     "  --kv-events ENDPOINT       publish the prefix cache's stored/removed blocks on a ZeroMQ PUB\n"
     "                             socket in vLLM's format, e.g. tcp://*:5557 (bound; an address\n"
     "                             without * is connected to) (default: off)\n"
     "  --kv-events-replay ENDPOINT  ROUTER socket answering replay requests (default: none)\n"
     "  --kv-events-topic T        topic of the events; a pool appends each model's name (default: \"\")\n"
     "  --kv-events-format array|map  msgpack arrays (vLLM's array_like) or maps (default: array)\n"
     "  --reasoning-budget N       think tokens before the block is closed, -1 = no cap (default: -1)\n"
     DEVICE_OPTS
     EXPERT_OPTS
     "  -v, --verbose              info-level logs (default: warnings only)\n"},
};

void cli_version_print(FILE *f)
{
#ifdef TERN_CUDA
    fprintf(f, "tern %s (CPU and CUDA backends)\n", TERN_VERSION);
#else
    fprintf(f, "tern %s (CPU backend)\n", TERN_VERSION);
#endif
}

int cli_help_print(const char *cmd, FILE *f)
{
    for (size_t i = 0; i < sizeof helps / sizeof helps[0]; i++)
        if (!strcmp(helps[i].name, cmd)) {
            fprintf(f, "usage: %s\n\n%s\n\noptions:\n%s", helps[i].synopsis, helps[i].what, helps[i].options);
            return 0;
        }
    return -1;
}

const char *cli_help_what(const char *cmd)
{
    for (size_t i = 0; i < sizeof helps / sizeof helps[0]; i++)
        if (!strcmp(helps[i].name, cmd))
            return helps[i].what;
    return NULL;
}
