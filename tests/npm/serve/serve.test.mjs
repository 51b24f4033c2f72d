// `duet serve` driven by the official openai client: completions and chat, streamed and not,
// stop strings, usage, 16 concurrent streams equal to each alone, abort mid-stream, and every
// kind of bad input. Run by run_serve_test.sh, which starts the server (DUET_BASE_URL).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import OpenAI from 'openai';

const base = process.env.DUET_BASE_URL;
const model = process.env.DUET_MODEL;
assert.ok(base && model, 'DUET_BASE_URL and DUET_MODEL must be set');
const apiKey = process.env.DUET_TEST_API_KEY;
assert.ok(apiKey, 'DUET_TEST_API_KEY must be set (the server is started with it)');
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey, maxRetries: 0, timeout: 60000 });

const greedy = { model, temperature: 0, ignore_eos: true };

async function streamText(params) {
  const stream = await client.completions.create({ ...params, stream: true });
  let text = '';
  let finish = null;
  let usage = null;
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      text += c.text;
      if (c.finish_reason) finish = c.finish_reason;
    }
    if (chunk.usage) usage = chunk.usage;
  }
  return { text, finish, usage };
}

async function metrics() {
  const body = await (await fetch(`${base}/metrics`)).text();
  const get = (name, labels = '') => {
    const re = new RegExp(`^${name}\\{[^}]*${labels}[^}]*\\} (\\S+)$`, 'm');
    const m = body.match(re);
    return m ? Number(m[1]) : NaN;
  };
  return {
    running: get('duet:num_requests_running'),
    waiting: get('duet:num_requests_waiting'),
    usedBlocks: get('duet:kv_cache_used_blocks'),
    aborted: get('duet:request_success_total', 'finished_reason="abort"'),
    ttftCount: get('duet:time_to_first_token_seconds_count'),
    body,
  };
}

async function waitIdle() {
  for (let i = 0; i < 100; i++) {  // at most 10 s
    const m = await metrics();
    if (m.running === 0 && m.waiting === 0 && m.usedBlocks === 0) return m;
    await new Promise((r) => setTimeout(r, 100));
  }
  assert.fail('the server did not become idle with all KV blocks free');
}

test('models, health and metrics', async () => {
  const list = await client.models.list();
  assert.deepEqual(list.data.map((m) => m.id), [model]);
  assert.equal((await fetch(`${base}/health`)).status, 200);
  const m = await metrics();
  for (const name of ['duet:num_requests_running', 'duet:num_requests_waiting', 'duet:kv_cache_usage_perc',
    'duet:prompt_tokens_total', 'duet:generation_tokens_total', 'duet:time_to_first_token_seconds_bucket',
    'duet:inter_token_latency_seconds_bucket', 'duet:step_gap_seconds_total', 'duet:step_gaps_total',
    'duet:forward_seconds_total', 'duet:forward_steps_total']) {
    assert.ok(m.body.includes(name), `/metrics lacks ${name}`);
  }
});

test('completion: plain and streamed agree, usage and finish_reason', async () => {
  const r = await client.completions.create({ ...greedy, prompt: 'The quick brown fox', max_tokens: 12 });
  assert.equal(r.object, 'text_completion');
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 12);
  assert.ok(r.usage.prompt_tokens > 0);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 12);
  const s = await streamText({ ...greedy, prompt: 'The quick brown fox', max_tokens: 12,
    stream_options: { include_usage: true } });
  assert.equal(s.text, r.choices[0].text);
  assert.equal(s.finish, 'length');
  assert.deepEqual(s.usage, r.usage);
});

test('completion from token ids', async () => {
  const r = await client.completions.create({ ...greedy, prompt: [1, 2, 3, 4, 5], max_tokens: 4 });
  assert.equal(r.usage.prompt_tokens, 5);
  assert.equal(r.usage.completion_tokens, 4);
});

test('seeded sampling is reproducible', async () => {
  const p = { model, prompt: 'Sampling', max_tokens: 10, temperature: 0.9, top_p: 0.9, top_k: 40, seed: 11, ignore_eos: true };
  const a = await client.completions.create(p);
  const b = await client.completions.create(p);
  assert.equal(a.choices[0].text, b.choices[0].text);
});

test('chat: plain and streamed agree', async () => {
  const messages = [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Hello there' }];
  const r = await client.chat.completions.create({ ...greedy, messages, max_tokens: 10 });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 10);
  const stream = await client.chat.completions.create({ ...greedy, messages, max_tokens: 10, stream: true,
    stream_options: { include_usage: true } });
  let text = '';
  let role = null;
  let finish = null;
  let usage = null;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    for (const c of chunk.choices) {
      if (c.delta.role) role = c.delta.role;
      text += c.delta.content ?? '';
      if (c.finish_reason) finish = c.finish_reason;
    }
    if (chunk.usage) usage = chunk.usage;
  }
  assert.equal(role, 'assistant');
  assert.equal(text, r.choices[0].message.content);
  assert.equal(finish, 'length');
  assert.deepEqual(usage, r.usage);
});

test('stop strings end the text before them, streamed or not', async () => {
  const full = (await client.completions.create({ ...greedy, prompt: 'Once upon a time', max_tokens: 24 }))
    .choices[0].text;
  // A stop string from the middle of the greedy text: two plain ASCII characters.
  let k = 3;
  while (k + 2 < full.length && !/^[!-~]{2}$/.test(full.slice(k, k + 2))) k++;
  assert.ok(k + 2 < full.length, `no ASCII pair in ${JSON.stringify(full)}`);
  const stop = full.slice(k, k + 2);
  const want = full.slice(0, full.indexOf(stop));
  const r = await client.completions.create({ ...greedy, prompt: 'Once upon a time', max_tokens: 24, stop: [stop, 'never-seen'] });
  assert.equal(r.choices[0].text, want);
  assert.equal(r.choices[0].finish_reason, 'stop');
  const s = await streamText({ ...greedy, prompt: 'Once upon a time', max_tokens: 24, stop });
  assert.equal(s.text, want);
  assert.equal(s.finish, 'stop');
});

test('16 concurrent streams each get exactly their greedy tokens alone', async () => {
  const prompts = Array.from({ length: 16 }, (_, i) => `Request number ${i} says${' hi'.repeat(i % 5)}`);
  const alone = [];
  for (const prompt of prompts) {
    alone.push((await client.completions.create({ ...greedy, prompt, max_tokens: 40 })).choices[0].text);
  }
  const together = await Promise.all(prompts.map((prompt) => streamText({ ...greedy, prompt, max_tokens: 40 })));
  together.forEach((s, i) => {
    assert.equal(s.text, alone[i], `stream ${i} differs from its request alone`);
    assert.equal(s.finish, 'length');
  });
  await waitIdle();
});

// A burst of new connections at once (one per request, as load generators open them): every one
// is answered. httplib's compiled-in listen backlog of 5 dropped some of such a burst; duet
// raises it after binding.
test('a burst of 128 new connections is answered in full', async () => {
  const http = await import('node:http');
  const url = new URL(`${base}/v1/completions`);
  const body = JSON.stringify({ ...greedy, prompt: [1, 2, 3], max_tokens: 2 });
  const one = () => new Promise((resolve) => {
    const req = http.request({ host: url.hostname, port: url.port, path: url.pathname, method: 'POST',
      agent: false, headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${apiKey}`,
        'Content-Length': Buffer.byteLength(body) } }, (res) => {
      let data = '';
      res.on('data', (d) => { data += d; });
      res.on('end', () => resolve({ status: res.statusCode, data }));
    });
    req.on('error', (e) => resolve({ status: 0, data: String(e) }));
    req.end(body);
  });
  const got = await Promise.all(Array.from({ length: 128 }, one));
  const failed = got.filter((r) => r.status !== 200);
  assert.equal(failed.length, 0, `${failed.length} of 128 failed, first: ${failed[0] && failed[0].data}`);
  await waitIdle();
});

test('a client that disconnects mid-stream aborts its request and frees its blocks', async () => {
  const before = await metrics();
  // The tiny model decodes a sequence alone at thousands of tokens a second, faster than a client
  // on a loaded machine reads three chunks. So six long holds come first: with them the stream
  // needs several times the KV cache, they take turns, and the stream, the newest, is the one
  // preempted every time, so it cannot reach its end before most holds have (as below).
  const holds = await Promise.all(Array.from({ length: 6 }, (_, i) =>
    client.completions.create({ ...greedy, prompt: `Hold on ${i}`, max_tokens: 1000, stream: true })));
  const stream = await client.completions.create({ ...greedy, prompt: 'Abort me', max_tokens: 1000, stream: true });
  let n = 0;
  for await (const chunk of stream) {
    if (chunk.choices.length && ++n === 3) break;  // leaving the loop aborts the HTTP request
  }
  assert.equal(n, 3);
  for (const a of holds) {
    let got = 0;
    for await (const chunk of a) got += chunk.choices.length ? 1 : 0;
    assert.ok(got > 0);
  }
  const after = await waitIdle();
  assert.equal(after.aborted, before.aborted + 1);
  const r = await client.completions.create({ ...greedy, prompt: 'Still there?', max_tokens: 3 });
  assert.equal(r.usage.completion_tokens, 3);
});

test('a client that leaves a non-streamed request aborts it and frees its blocks', async () => {
  const before = await metrics();
  // Six long holds and B need several times the KV cache, so they take turns (preemption), and
  // B, the newest, is the one preempted every time: it cannot finish before most holds have, which
  // keeps it in the engine for many times the server's hang-up poll after its client has left.
  const holds = await Promise.all(Array.from({ length: 6 }, (_, i) =>
    client.completions.create({ ...greedy, prompt: `Hold ${i}`, max_tokens: 1000, stream: true })));
  const controller = new AbortController();
  const b = fetch(`${base}/v1/completions`, { method: 'POST', signal: controller.signal,
    headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${apiKey}` },
    body: JSON.stringify({ ...greedy, prompt: 'Leave me', max_tokens: 1000 }) });
  // Leave once the engine holds B (and the holds): from then on B is in flight.
  let held = false;
  for (let i = 0; i < 500 && !held; i++) {
    const m = await metrics();
    held = m.running + m.waiting >= 7;
  }
  assert.ok(held, 'B never reached the engine');
  controller.abort();  // before any byte of B's response has come
  await assert.rejects(b, { name: 'AbortError' });
  for (const a of holds) {
    let n = 0;
    for await (const chunk of a) n += chunk.choices.length ? 1 : 0;
    assert.ok(n > 0);
  }
  const after = await waitIdle();
  assert.equal(after.aborted, before.aborted + 1, 'B finished instead of being aborted');
});

test('a client that stalls in its request headers gets a 400 after the read timeout; others are served meanwhile', async () => {
  const net = await import('node:net');
  const url = new URL(base);
  const sock = net.connect(Number(url.port), url.hostname);
  await new Promise((r) => sock.once('connect', r));
  sock.write('POST /v1/completions HTTP/1.1\r\nHost: x\r\n');  // and never the rest
  const t0 = Date.now();
  const answer = new Promise((r) => {
    let got = '';
    sock.on('data', (d) => { got += d; if (got.includes('\r\n\r\n')) r(got); });
    sock.once('close', () => r(got));
  });
  const r = await client.completions.create({ ...greedy, prompt: 'Meanwhile', max_tokens: 3 });
  assert.equal(r.usage.completion_tokens, 3);
  const got = await answer;
  sock.destroy();
  const s = (Date.now() - t0) / 1000;
  assert.match(got, /^HTTP\/1\.1 400 /);
  assert.ok(s < 8, `the stalled request was answered after ${s} s`);
});

// Run when the server was started with --header-timeout (DUET_TEST_HEADER_TIMEOUT, in seconds).
const headerTimeout = Number(process.env.DUET_TEST_HEADER_TIMEOUT || 0);

// A client that sends a byte every 0.5 s never trips the 5 s per-read timeout: only the whole
// request's deadline ends it (slowloris). Headers trickled, then a body trickled after whole
// headers: each gets a 408 with an OpenAI error, and a request meanwhile is served.
async function trickle(head, bytes) {
  const net = await import('node:net');
  const url = new URL(base);
  const sock = net.connect(Number(url.port), url.hostname);
  await new Promise((r) => sock.once('connect', r));
  sock.write(head);
  const t0 = Date.now();
  let got = '';
  let closed = false;
  sock.on('data', (d) => { got += d; });
  sock.once('close', () => { closed = true; });
  sock.on('error', () => { closed = true; });
  for (let i = 0; !closed && Date.now() - t0 < 3 * headerTimeout * 1000; i++) {
    if (!sock.destroyed) sock.write(bytes[i % bytes.length]);
    await new Promise((r) => setTimeout(r, 500));
  }
  sock.destroy();
  return { got, seconds: (Date.now() - t0) / 1000 };
}

test('a client that trickles its headers or body past --header-timeout gets a 408; others are served meanwhile',
  { skip: headerTimeout ? false : 'the server has no --header-timeout to test' }, async () => {
    const headers = trickle('POST /v1/completions HTTP/1.1\r\nHost: x\r\n', 'X-Slow: abcdefgh\r\n');
    const body = trickle('POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n' +
      `Authorization: Bearer ${apiKey}\r\nContent-Length: 100000\r\n\r\n`, '{"prompt":"abcdefgh",');
    const r = await client.completions.create({ ...greedy, prompt: 'Meanwhile', max_tokens: 3 });
    assert.equal(r.usage.completion_tokens, 3);
    for (const [what, t] of [['headers', await headers], ['body', await body]]) {
      assert.match(t.got, /^HTTP\/1\.1 408 /, `${what}: ${t.got}`);
      const json = JSON.parse(t.got.slice(t.got.indexOf('\r\n\r\n') + 4));
      assert.equal(json.error.code, 408, what);
      assert.ok(t.seconds >= headerTimeout - 1 && t.seconds < 2 * headerTimeout + 2,
        `${what}: answered after ${t.seconds} s with --header-timeout ${headerTimeout}`);
    }
  });

// Raw requests, so that the body is exactly what is under test.
async function post(path, body) {
  const res = await fetch(`${base}${path}`, { method: 'POST',
    headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${apiKey}` },
    body: typeof body === 'string' ? body : JSON.stringify(body) });
  return { status: res.status, json: await res.json() };
}

function assertOpenAiError(r, status, what) {
  assert.equal(r.status, status, `${what}: status ${r.status}, body ${JSON.stringify(r.json)}`);
  const e = r.json.error;
  assert.ok(e && typeof e.message === 'string' && e.message.length > 0, `${what}: no error.message`);
  assert.equal(typeof e.type, 'string', `${what}: no error.type`);
  assert.ok('param' in e && 'code' in e, `${what}: error lacks param or code`);
}

test('bad input gets a 4xx OpenAI error and the server keeps serving', async () => {
  const c = '/v1/completions';
  const chat = '/v1/chat/completions';
  const p = { model, prompt: 'x', max_tokens: 2 };
  const cases = [
    [c, '{"prompt": "x", "max_tokens": ', 400, 'malformed JSON'],
    [c, '[1, 2]', 400, 'not an object'],
    [c, { ...p, max_tokens: 'ten' }, 400, 'max_tokens a string'],
    [c, { ...p, temperature: 'hot' }, 400, 'temperature a string'],
    [c, { ...p, prompt: 5 }, 400, 'prompt a number'],
    [c, { ...p, stream: 'yes' }, 400, 'stream a string'],
    [c, { ...p, stop: [1] }, 400, 'stop not strings'],
    [chat, { model, messages: 'hi' }, 400, 'messages a string'],
    [chat, { model, messages: [{ role: 'wizard', content: 'x' }] }, 400, 'unknown role'],
    [c, { ...p, temperature: 5 }, 400, 'temperature out of range'],
    [c, { ...p, top_p: 0 }, 400, 'top_p 0'],
    [c, { ...p, top_p: 1.5 }, 400, 'top_p > 1'],
    [c, { ...p, top_k: -5 }, 400, 'top_k < -1'],
    [c, { ...p, max_tokens: 0 }, 400, 'max_tokens 0'],
    [c, { ...p, max_tokens: -3 }, 400, 'max_tokens negative'],
    [c, { ...p, n: 2 }, 400, 'n 2'],
    [c, { ...p, frobnicate: true }, 400, 'unknown field'],
    [c, { ...p, model: 'no-such-model' }, 404, 'unknown model'],
    [c, { ...p, prompt: Array(3000).fill(7) }, 400, 'prompt longer than the context'],
    [c, { ...p, prompt: Array(1100).fill(7), max_tokens: 100 }, 400, 'more KV blocks than the whole cache'],
    [c, { ...p, prompt: '' }, 400, 'empty prompt'],
    [c, { ...p, prompt: [] }, 400, 'empty token prompt'],
    [chat, { model, messages: [] }, 400, 'empty messages'],
    [c, { ...p, max_tokens: 1e9 }, 400, 'huge max_tokens'],
    [c, { ...p, max_tokens: 1e30 }, 400, 'max_tokens beyond int64'],
    [c, { ...p, prompt: [1, 99999] }, 400, 'token id outside the vocabulary'],
  ];
  for (const [path, body, status, what] of cases) assertOpenAiError(await post(path, body), status, what);

  // A body over the server's 32 MiB limit: 413 with an OpenAI error object.
  const huge = await post('/v1/completions', JSON.stringify({ model, prompt: 'x'.repeat(33 << 20) }));
  assertOpenAiError(huge, 413, 'body over 32 MiB');

  const unknownPath = await fetch(`${base}/v1/nothing`, { headers: { Authorization: `Bearer ${apiKey}` } });
  assert.equal(unknownPath.status, 404);

  // The SDK surfaces these as typed errors too.
  await assert.rejects(client.completions.create({ ...p, temperature: 7 }), (e) => e instanceof OpenAI.BadRequestError);
  await assert.rejects(client.completions.create({ ...p, model: 'nope' }), (e) => e instanceof OpenAI.NotFoundError);

  const r = await client.completions.create({ ...greedy, prompt: 'after the bad input', max_tokens: 3 });
  assert.equal(r.usage.completion_tokens, 3);
  await waitIdle();
});

test('API key: missing or wrong gets 401 with an OpenAI error on every /v1 route; health and metrics stay open', async () => {
  const body = JSON.stringify({ model, prompt: 'hi', max_tokens: 1 });
  for (const [path, method] of [['/v1/completions', 'POST'], ['/v1/chat/completions', 'POST'], ['/v1/models', 'GET']]) {
    for (const auth of [null, 'Bearer wrong-key', `Bearer ${apiKey}x`, apiKey, `Basic ${apiKey}`]) {
      const headers = { 'Content-Type': 'application/json' };
      if (auth) headers.Authorization = auth;
      const res = await fetch(`${base}${path}`, { method, headers, body: method === 'POST' ? body : undefined });
      assert.equal(res.status, 401, `${method} ${path} with ${auth}`);
      const j = await res.json();
      assert.equal(j.error.code, 'invalid_api_key');
      assert.ok(!JSON.stringify(j).includes(apiKey), 'the error must not echo the key');
    }
  }
  const wrong = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(wrong.models.list(), (e) => e instanceof OpenAI.AuthenticationError);
  assert.equal((await fetch(`${base}/health`)).status, 200);
  assert.equal((await fetch(`${base}/metrics`)).status, 200);
  assert.equal((await client.models.list()).data[0].id, model);
});
