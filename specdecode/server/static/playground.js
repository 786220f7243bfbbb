// specdecode playground: plain JavaScript over this server's own OpenAI-compatible API.
// Every request streams with "speculation": {"trace": true}; each chunk's `speculation` field says where its
// tokens came from (docs/serving.md, "Playground"). Server text is only ever set as textContent.
"use strict";

const $ = (id) => document.getElementById(id);
const KIND = { draft: "draft", grammar: "grammar", bonus: "target", correction: "target", target: "target" };
const WHAT = {
  draft: "accepted draft token",
  grammar: "forced by the grammar",
  bonus: "target's own token (bonus: the draft was accepted to its end)",
  correction: "target's own token (correction: it refused the draft token here)",
  target: "target's own token (nothing drafted)",
};
let model = null;
let running = null; // the AbortController of the request in flight
let loading = null; // the loadServer() in flight

function setState(state, status) {
  document.documentElement.dataset.state = state;
  $("status").textContent = status || "";
  const busy = state === "running";
  $("send").disabled = busy;
  $("compare").disabled = busy;
  $("stop").disabled = !busy;
}

function showError(message) {
  $("error").textContent = message;
  $("error").hidden = !message;
}

function headers() {
  const out = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) out.Authorization = "Bearer " + key;
  return out;
}

// the server's own one-line error message from an error response (OpenAI's shape), else the status
async function failure(response) {
  let message = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    if (body && body.error && body.error.message) message = body.error.message;
  } catch (_) { /* not JSON: the status line says it */ }
  return new Error(message);
}

async function getJSON(path) {
  const response = await fetch(path, { headers: headers() });
  if (!response.ok) throw await failure(response);
  return response.json();
}

// the served model's name and the drafters a request may choose (from the API's own description)
function loadServer() {
  if (!loading) loading = askServer().finally(() => { loading = null; });
  return loading;
}

async function askServer() {
  try {
    const models = await getJSON("/v1/models");
    model = models.data[0].id;
    $("model").textContent = "model: " + model;
    const api = await getJSON("/openapi.json");
    const drafter = api.components.schemas.SpeculationOptions.properties.drafter;
    const names = (drafter.enum || []).filter((name) => name && name !== "none");
    const select = $("drafter");
    for (const option of [...select.options]) if (option.value && option.value !== "none") option.remove();
    for (const name of names) select.add(new Option(name, name));
    showError("");
  } catch (error) {
    model = null;
    $("model").textContent = "model: ?";
    showError(error.message);
  }
}

function number(id) {
  const text = $(id).value.trim();
  return text === "" ? undefined : Number(text);
}

// the request body from the form; speculation: the `speculation` extension to send
function body(speculation) {
  const chat = document.querySelector("input[name=mode]:checked").value === "chat";
  const prompt = $("prompt").value;
  const out = { model: model || "", stream: true, stream_options: { include_usage: true }, speculation };
  if (chat) out.messages = [{ role: "user", content: prompt }];
  else out.prompt = prompt;
  const maxTokens = number("max-tokens");
  if (maxTokens !== undefined) out.max_tokens = maxTokens;
  const temperature = number("temperature");
  if (temperature !== undefined) out.temperature = temperature;
  if ($("logprobs").checked) {
    if (chat) out.logprobs = true;
    else out.logprobs = 0;
  }
  return { path: chat ? "/v1/chat/completions" : "/v1/completions", body: out };
}

function speculationAsked() {
  const out = { trace: true };
  const drafter = $("drafter").value;
  if (drafter) out.drafter = drafter;
  const k = number("k");
  if (k !== undefined) out.k = k;
  return out;
}

// Streams one request; onChunk gets each parsed chunk. Resolves when [DONE] arrives; an error event or an error
// status rejects with the server's message.
async function stream(path, payload, onChunk, signal) {
  const response = await fetch(path, { method: "POST", headers: headers(), body: JSON.stringify(payload), signal });
  if (!response.ok) throw await failure(response);
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data === "[DONE]") return;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message);
        onChunk(chunk);
      }
    }
  }
  throw new Error("the stream ended before [DONE]");
}

// One answer being written into an element: tokens coloured by origin. A chunk's text can lag its tokens (the
// server holds back text that may begin a stop string) or differ from their own decodings (a character split
// across tokens), so tokens are drawn one by one only where their decodings spell the text that arrived.
class Answer {
  constructor(element) {
    this.element = element;
    this.element.replaceChildren();
    this.text = "";
    this.pendingText = "";
    this.pendingTokens = [];
    this.tokens = 0;
    this.steps = 0;
    this.drafted = 0;
    this.accepted = 0;
    this.proposedAt = [];
    this.acceptedAt = [];
    this.started = performance.now();
    this.ended = null;
    this.usage = null;
  }

  add(chunk) {
    if (chunk.usage) this.usage = chunk.usage;
    const choice = chunk.choices && chunk.choices[0];
    if (!choice) return;
    const text = choice.delta ? (choice.delta.content || "") : (choice.text || "");
    const trace = chunk.speculation;
    if (trace) this.observe(trace);
    if (!text && !trace) return;
    this.text += text;
    this.pendingText += text;
    if (trace) this.pendingTokens.push(...trace.tokens);
    this.flush(false);
  }

  // a step's figures, counted as the server's /metrics counts them (acceptance at depth i of drafts that reached it)
  observe(trace) {
    this.steps += 1;
    this.tokens += trace.tokens.length;
    this.drafted += trace.drafted;
    this.accepted += trace.accepted;
    for (let i = 0; i < trace.drafted; i++) {
      this.proposedAt[i] = (this.proposedAt[i] || 0) + 1;
      this.acceptedAt[i] = (this.acceptedAt[i] || 0) + (i < trace.accepted ? 1 : 0);
    }
  }

  flush(final) {
    if (!this.pendingText && !final) return;
    const spelled = this.pendingTokens.map((token) => token.text).join("");
    if (spelled === this.pendingText) {
      for (const token of this.pendingTokens) this.element.append(tokenSpan(token));
    } else if (final || !spelled.startsWith(this.pendingText)) {
      if (this.pendingText) this.element.append(mixedSpan(this.pendingText, this.pendingTokens));
    } else {
      return; // the text has not caught up with its tokens yet
    }
    this.pendingText = "";
    this.pendingTokens = [];
  }

  finish() {
    this.flush(true);
    this.ended = performance.now();
  }

  // from sending the request to its last chunk (while it streams: to now)
  get seconds() {
    return ((this.ended === null ? performance.now() : this.ended) - this.started) / 1000;
  }
}

function tokenSpan(token) {
  const span = document.createElement("span");
  span.className = "tok tok-" + KIND[token.origin];
  span.dataset.origin = token.origin;
  span.textContent = token.text;
  let title = `${WHAT[token.origin]}\nposition ${token.position} in the draft\ntoken id ${token.id}`;
  if (token.logprob !== undefined) title += `\nlogprob ${token.logprob.toFixed(3)}`;
  span.title = title;
  return span;
}

// text whose tokens do not spell it one by one: one span, coloured when its tokens share an origin
function mixedSpan(text, tokens) {
  const span = document.createElement("span");
  const kinds = new Set(tokens.map((token) => KIND[token.origin]));
  span.className = "tok " + (kinds.size === 1 ? "tok-" + [...kinds][0] : kinds.size ? "tok-mixed" : "tok-plain");
  if (kinds.size === 1) span.dataset.origin = tokens[0].origin;
  span.textContent = text;
  const described = (token) => `${token.origin} at position ${token.position}` +
    (token.logprob === undefined ? "" : `, logprob ${token.logprob.toFixed(3)}`);
  if (tokens.length) span.title = tokens.map(described).join("\n");
  return span;
}

function showFigures(answer) {
  const seconds = answer.seconds;
  $("tps").textContent = seconds > 0 ? (answer.tokens / seconds).toFixed(1) : "–";
  const usage = answer.usage;
  const tau = usage ? usage.tau : answer.steps ? answer.tokens / answer.steps : null;
  $("tau").textContent = tau === null ? "–" : tau.toFixed(2);
  $("drafted").textContent = String(answer.drafted);
  $("accepted").textContent = String(answer.accepted);
  $("rate").textContent = answer.drafted ? (100 * answer.accepted / answer.drafted).toFixed(0) + " %" : "–";
  $("tokens").textContent = String(answer.tokens);
  drawChart(answer);
}

function drawChart(answer) {
  const chart = $("chart");
  chart.replaceChildren();
  answer.proposedAt.forEach((proposed, i) => {
    const rate = proposed ? answer.acceptedAt[i] / proposed : 0;
    const bar = document.createElement("div");
    bar.className = "bar";
    bar.title = `position ${i + 1}: ${answer.acceptedAt[i]} of ${proposed} accepted (${(100 * rate).toFixed(0)} %)`;
    const fill = document.createElement("div");
    fill.className = "fill";
    fill.style.height = (100 * rate).toFixed(1) + "%";
    const label = document.createElement("span");
    label.className = "pos";
    label.textContent = String(i + 1);
    bar.append(fill, label);
    chart.append(bar);
  });
}

// one streamed request drawn into `element`; returns the finished Answer
async function run(element, speculation, live) {
  const { path, body: payload } = body(speculation);
  const answer = new Answer(element);
  running = new AbortController();
  try {
    await stream(path, payload, (chunk) => {
      answer.add(chunk);
      if (live) showFigures(answer);
    }, running.signal);
  } finally {
    answer.finish();
    running = null;
  }
  if (live) showFigures(answer);
  return answer;
}

async function guarded(work) {
  showError("");
  setState("running", "streaming…");
  try {
    if (model === null) await loadServer();
    if (model === null) throw new Error($("error").textContent || "the server's model is unknown");
    await work();
    setState("done", "done");
  } catch (error) {
    const message = error.name === "AbortError" ? "stopped" : error.message;
    showError(message);
    setState("error", "");
  }
}

function send(event) {
  event.preventDefault();
  $("comparison").hidden = true;
  guarded(() => run($("answer"), speculationAsked(), true));
}

function compare() {
  guarded(async () => {
    $("comparison").hidden = false;
    $("compare-note").textContent = "";
    $("compare-note").className = "";
    $("spec-time").textContent = "";
    $("plain-time").textContent = "";
    $("plain-text").replaceChildren();
    const asked = speculationAsked();
    if (asked.drafter === "none") delete asked.drafter; // "with speculation": the server's default drafter
    if (asked.k === 0) delete asked.k;
    setState("running", "with speculation…");
    const spec = await run($("spec-text"), asked, true);
    $("spec-time").textContent = timing(spec);
    setState("running", "without speculation…");
    const plain = await run($("plain-text"), { drafter: "none", trace: true }, false);
    $("plain-time").textContent = timing(plain);
    const note = $("compare-note");
    if (spec.text === plain.text) {
      note.textContent = `The texts are identical; with speculation ${(plain.seconds / spec.seconds).toFixed(2)}x ` +
        "as fast as without.";
      note.className = "same";
    } else {
      const sampled = Number($("temperature").value || "1") > 0;
      note.textContent = "The texts differ" + (sampled
        ? ": with temperature > 0 both are samples of the same distribution, not the same draws."
        : ". Greedy decoding should give the same text: please report it.");
      note.className = "differ";
    }
  });
}

function timing(answer) {
  const tau = answer.usage ? `, tau ${answer.usage.tau.toFixed(2)}` : "";
  return `${answer.seconds.toFixed(2)} s, ${answer.tokens} tokens${tau}`;
}

document.addEventListener("DOMContentLoaded", () => {
  $("form").addEventListener("submit", send);
  $("compare").addEventListener("click", compare);
  $("stop").addEventListener("click", () => running && running.abort());
  $("api-key").addEventListener("change", loadServer);
  setState("idle", "");
  loadServer();
});
