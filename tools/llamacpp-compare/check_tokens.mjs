// Checks that llama.cpp (through node-llama-cpp) computes the same model as duet on a GGUF made by
// to_gguf.py: compares llama.cpp's logits at every prompt position (the prompt in one batch, then
// one token per llama_decode) with those duet dumped, and
// llama.cpp's greedy continuation with duet's.
//
// Usage:
//   build/duet generate MODEL_DIR --prompt-ids 1,2,3 --max-tokens 16 --threads 2 --ignore-eos \
//       --dump-logits /tmp/duet.json
//   node check_tokens.mjs MODEL.gguf /tmp/duet.json
import fs from "node:fs";
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const [ggufPath, dumpPath] = process.argv.slice(2);
if (!ggufPath || !dumpPath) {
    console.error("usage: node check_tokens.mjs MODEL.gguf DUET_DUMP.json");
    process.exit(2);
}
// {tokens: [n_prompt], logits: [n_prompt][n_vocab], generated: [n_gen]}
const dump = JSON.parse(fs.readFileSync(dumpPath, "utf8"));

const llama = await getLlama({gpu: false, build: "never", skipDownload: true, maxThreads: 2,
                              logLevel: LlamaLogLevel.warn});
const model = await llama.loadModel({modelPath: ggufPath});
const context = await model.createContext({contextSize: 2048, sequences: 3, threads: {ideal: 2, min: 2}});

// Logits at every prompt position, once with the prompt in one batch (llama.cpp's prefill path)
// and once fed one token per llama_decode (its decode path).
for (const oneByOne of [false, true]) {
    console.log(oneByOne ? "one token per decode:" : "whole prompt in one batch:");
    const sequence = context.getSequence();
    const input = dump.tokens.map((token) => [token, {generateNext: {logits: true}}]);
    const output = [];
    if (oneByOne) {
        for (const item of input) output.push((await sequence.controlledEvaluate([item]))[0]);
    } else {
        output.push(...await sequence.controlledEvaluate(input));
    }
    let worst = 0;
    for (let pos = 0; pos < dump.tokens.length; pos++) {
        const ours = output[pos].next.logits;  // Map token -> logit, highest first
        const theirs = dump.logits[pos];
        let maxDiff = 0;
        let theirArgmax = 0;
        for (let t = 0; t < theirs.length; t++) {
            maxDiff = Math.max(maxDiff, Math.abs(ours.get(t) - theirs[t]));
            if (theirs[t] > theirs[theirArgmax]) theirArgmax = t;
        }
        const ourArgmax = ours.keys().next().value;
        const sorted = [...theirs].sort((a, b) => b - a);
        worst = Math.max(worst, maxDiff);
        console.log(`pos ${pos}: max |logit diff| ${maxDiff.toFixed(4)}, argmax llama.cpp ${ourArgmax}` +
                    ` duet ${theirArgmax} (duet top-2 gap ${(sorted[0] - sorted[1]).toFixed(4)})`);
    }
    console.log(`worst |logit diff| over the prompt: ${worst.toFixed(4)}`);
    sequence.dispose();
}

// Greedy continuation.
{
    const sequence = context.getSequence();
    const generated = [];
    for await (const token of sequence.evaluate(dump.tokens, {temperature: 0})) {
        generated.push(token);
        if (generated.length >= dump.generated.length) break;
    }
    let same = 0;
    while (same < generated.length && generated[same] === dump.generated[same]) same++;
    console.log(`llama.cpp greedy: ${generated.join(",")}`);
    console.log(`duet greedy:      ${dump.generated.join(",")}`);
    console.log(`first ${same} of ${generated.length} generated tokens match`);
}
await context.dispose();
await model.dispose();
