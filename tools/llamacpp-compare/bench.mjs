// Prefill and decode speed of llama.cpp (the prebuilt CPU binary of node-llama-cpp) on one batch,
// measured the way `duet bench latency` measures duet, so the two can be run side by side:
//   - B sequences, each a prompt of P random token ids (seeded), G generated tokens, greedy;
//   - one warm-up run of the same shape, then the measured run on cleared sequences;
//   - prefill = all B prompts in one llama_decode, up to and including sampling the first token
//     of every sequence; decode = the remaining G - 1 steps, each one llama_decode of B tokens
//     (one per sequence); decode tok/s = (G - 1) * B / decode time.
// Every llama_decode is counted (through the context's addToBatch/decodeBatch), and the run fails
// if the batches were not the ones described above.
//
// Usage: node bench.mjs [--model PATH] [--batch B] [--prompt-len P] [--gen-len G] [--threads N]
//                       [--seed S] [--flash-attention auto|on|off] [--json]
import fs from "node:fs";
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const kDefaults = {model: "/tmp/qwen3-moe-small-bf16.gguf", batch: 1, promptLen: 128, genLen: 64,
                   threads: 2, seed: 0, flashAttention: "auto", json: false};

function parseArgs(argv) {
    const o = {...kDefaults};
    const names = {"--model": "model", "--batch": "batch", "--prompt-len": "promptLen",
                   "--gen-len": "genLen", "--threads": "threads", "--seed": "seed",
                   "--flash-attention": "flashAttention"};
    for (let i = 0; i < argv.length; i++) {
        if (argv[i] === "--json") { o.json = true; continue; }
        const key = names[argv[i]];
        if (!key || i + 1 >= argv.length) throw new Error(`unknown or incomplete option ${argv[i]}`);
        const v = argv[++i];
        o[key] = key === "model" || key === "flashAttention" ? v : Number(v);
    }
    if (!["auto", "on", "off"].includes(o.flashAttention)) throw new Error("--flash-attention auto|on|off");
    if (o.genLen < 2) throw new Error("--gen-len must be at least 2 (the first token comes from prefill)");
    return o;
}

// Deterministic prompts (mulberry32); duet draws its own with std::mt19937_64, so the ids differ,
// but random ids of a random-weight model make the same work for both engines.
function makePrompts({batch, promptLen, seed}, nVocab) {
    let s = (seed + 0x9e3779b9) >>> 0;
    const next = () => {
        s = (s + 0x6d2b79f5) >>> 0;
        let t = Math.imul(s ^ (s >>> 15), 1 | s);
        t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
        return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    };
    return Array.from({length: batch}, () =>
        Array.from({length: promptLen}, () => Math.floor(next() * nVocab)));
}

// Counts llama_decode calls, the tokens of each and the time spent in them, by wrapping the
// context's native batch calls (node-llama-cpp fills one llama_batch with addToBatch, then
// decodeBatch runs llama_decode on it in a worker thread and resolves when it returns).
function instrument(context) {
    const native = context._ctx;
    const calls = [];  // tokens per llama_decode
    let pending = 0;
    let decodeMs = 0;  // wall time inside decodeBatch since the last take()
    const addToBatch = native.addToBatch.bind(native);
    const decodeBatch = native.decodeBatch.bind(native);
    // The addon's methods are read-only on its prototype, so they are shadowed on the instance.
    Object.defineProperty(native, "addToBatch", {value: (seqId, firstPos, tokens, logitIndexes) => {
        pending += tokens.length;
        return addToBatch(seqId, firstPos, tokens, logitIndexes);
    }});
    Object.defineProperty(native, "decodeBatch", {value: async () => {
        calls.push(pending);
        pending = 0;
        const t0 = performance.now();
        try {
            return await decodeBatch();
        } finally {
            decodeMs += performance.now() - t0;
        }
    }});
    return {
        take() {
            const ms = decodeMs;
            decodeMs = 0;
            return Object.assign(calls.splice(0), {ms});
        },
    };
}

// One run: prefill all prompts together, then G - 1 decode steps of all sequences together.
async function runOnce(sequences, prompts, genLen, counter) {
    for (const sequence of sequences) {
        await sequence.clearHistory();
        if (sequence.nextTokenIndex !== 0) throw new Error("sequence not cleared");
    }
    counter.take();
    const generators = sequences.map((sequence, i) =>
        sequence.evaluate(prompts[i], {temperature: 0, yieldEogToken: true}));
    const step = async () => {
        const results = await Promise.all(generators.map((g) => g.next()));
        if (results.some((r) => r.done)) throw new Error("a sequence stopped early");
    };

    let t0 = performance.now();
    await step();  // every generator queues its prompt before the batch is dispatched
    const prefillSeconds = (performance.now() - t0) / 1e3;
    const prefillCalls = counter.take();

    t0 = performance.now();
    for (let i = 1; i < genLen; i++) await step();
    const decodeSeconds = (performance.now() - t0) / 1e3;
    const decodeCalls = counter.take();
    await Promise.all(generators.map((g) => g.return()));
    return {prefillSeconds, prefillCalls, decodeSeconds, decodeCalls};
}

function checkBatches(run, o) {
    const prefillTokens = run.prefillCalls.reduce((a, b) => a + b, 0);
    if (run.prefillCalls.length !== 1 || prefillTokens !== o.batch * o.promptLen)
        throw new Error(`prefill was ${run.prefillCalls.length} llama_decode calls of ` +
                        `${run.prefillCalls.join(",")} tokens, expected 1 of ${o.batch * o.promptLen}`);
    if (run.decodeCalls.length !== o.genLen - 1 || run.decodeCalls.some((n) => n !== o.batch))
        throw new Error(`decode was ${run.decodeCalls.length} llama_decode calls of ` +
                        `${[...new Set(run.decodeCalls)].join(",")} tokens, expected ` +
                        `${o.genLen - 1} of ${o.batch}`);
}

// The ggml CPU backend variant node-llama-cpp's loader picked (one libggml-cpu-<variant>.so is
// mapped into this process).
function loadedCpuVariants() {
    const maps = fs.readFileSync("/proc/self/maps", "utf8");
    return [...new Set([...maps.matchAll(/libggml-cpu-([\w-]+)\.so/g)].map((m) => m[1]))];
}

function versions() {
    const root = new URL("./node_modules/node-llama-cpp/", import.meta.url);
    const read = (path) => JSON.parse(fs.readFileSync(new URL(path, root), "utf8"));
    return `node-llama-cpp ${read("package.json").version}, ` +
           `llama.cpp release ${read("llama/llama.cpp.info.json").tag}`;
}

async function main() {
    const o = parseArgs(process.argv.slice(2));
    const logLines = [];
    const llama = await getLlama({
        gpu: false, build: "never", skipDownload: true, maxThreads: o.threads,
        logLevel: LlamaLogLevel.info,
        logger: (level, message) => logLines.push(message.trim()),
    });
    const model = await llama.loadModel({modelPath: o.model});
    const vocabSize = model.fileInfo.metadata.tokenizer.ggml.tokens.length;
    const batchSize = Math.max(512, o.batch * o.promptLen);
    const context = await model.createContext({
        sequences: o.batch,
        contextSize: o.promptLen + o.genLen,
        batchSize,
        threads: {ideal: o.threads, min: o.threads},
        flashAttention: o.flashAttention === "auto" ? "auto" : o.flashAttention === "on",
    });
    const counter = instrument(context);
    const sequences = Array.from({length: o.batch}, () => context.getSequence());
    const prompts = makePrompts(o, vocabSize);

    await runOnce(sequences, prompts, o.genLen, counter);  // warm-up
    const run = await runOnce(sequences, prompts, o.genLen, counter);
    checkBatches(run, o);

    const decodeSteps = o.genLen - 1;
    const result = {
        engine: "llama.cpp", versions: versions(), time: new Date().toISOString(),
        batch: o.batch, promptLen: o.promptLen, genLen: o.genLen, threads: o.threads,
        cpuVariant: loadedCpuVariants().join(","), systemInfo: llama.systemInfo.trim(),
        flashAttention: [...new Set(logLines.filter((l) => /flash/i.test(l)))].join(" | "),
        prefillTokPerS: o.batch * o.promptLen / run.prefillSeconds,
        prefillSeconds: run.prefillSeconds,
        decodeTokPerS: decodeSteps * o.batch / run.decodeSeconds,
        decodeMsPerStep: run.decodeSeconds / decodeSteps * 1e3,
        decodeSteps, nUbatch: batchSize,
        // Share of the decode time spent inside llama_decode; the rest is node-llama-cpp's
        // sampling and bookkeeping between steps.
        decodeShareInLlamaDecode: run.decodeCalls.ms / (run.decodeSeconds * 1e3),
    };
    if (o.json) {
        console.log(JSON.stringify(result));
    } else {
        console.log(`${result.versions}; ggml CPU backend: ${result.cpuVariant}`);
        console.log(`system info: ${result.systemInfo}`);
        console.log(`context: ${result.flashAttention || "(flash_attn not logged)"}`);
        console.log(`model ${o.model}, batch ${o.batch}, prompt ${o.promptLen}, gen ${o.genLen}, ` +
                    `${o.threads} threads, n_batch = n_ubatch = ${batchSize}, ${result.time}`);
        console.log(`prefill: ${result.prefillTokPerS.toFixed(1).padStart(8)} tok/s  ` +
                    `(${run.prefillSeconds.toFixed(3)} s for ${o.batch * o.promptLen} tokens, ` +
                    `1 llama_decode)`);
        console.log(`decode:  ${result.decodeTokPerS.toFixed(1).padStart(8)} tok/s  ` +
                    `(${result.decodeMsPerStep.toFixed(2)} ms/step, ${decodeSteps} steps x ` +
                    `${o.batch} seqs, one llama_decode of ${o.batch} tokens per step, ` +
                    `${(result.decodeShareInLlamaDecode * 100).toFixed(1)} % of it inside llama_decode)`);
    }
    await context.dispose();
    await model.dispose();
}

await main();
