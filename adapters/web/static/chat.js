// The web chat page. Every text from the server arrives as HTML it rendered (raw HTML escaped);
// everything the page writes itself goes through textContent.
"use strict";

const log = document.getElementById("log");
const typing = document.getElementById("typing");
const statusLine = document.getElementById("status");
const nameInput = document.getElementById("name");
const textInput = document.getElementById("text");
const form = document.getElementById("compose");
const fileInput = document.getElementById("files");
const pendingList = document.getElementById("pending");
const MAX_FILES = 10;
let pending = [];  // files chosen or dropped, sent with the next message
const local = new Map();  // client message id -> bubble (until its transcript row arrives)
const live = new Map();   // reply id -> bubble (previews and replies not in the transcript)
let session = null;
let after = 0;
let typingTimer = null;
let source = null;

nameInput.value = localStorage.getItem("gw-name") || "";
nameInput.addEventListener("change", () => localStorage.setItem("gw-name", nameInput.value.trim()));

function newId() {
  const bytes = new Uint8Array(16);
  crypto.getRandomValues(bytes);
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

function bubble(role, metaText) {
  const el = document.createElement("div");
  el.className = "msg " + role;
  const meta = document.createElement("div");
  meta.className = "meta";
  meta.textContent = metaText;
  const body = document.createElement("div");
  body.className = "body";
  el.append(meta, body);
  log.append(el);
  log.scrollTop = log.scrollHeight;
  return el;
}

function showFiles(el, files) {
  // Images as <img> from /web/files (this browser's own conversation only), other files by name.
  let box = el.querySelector(".files");
  if (!files || !files.length) return;
  if (!box) {
    box = document.createElement("div");
    box.className = "files";
    el.querySelector(".body").before(box);
  }
  box.replaceChildren();
  for (const f of files) {
    if (f.url) {
      const img = document.createElement("img");
      img.src = f.url;
      img.alt = f.name || "image";
      img.loading = "lazy";
      box.append(img);
    } else {
      const chip = document.createElement("span");
      chip.className = "file";
      chip.textContent = "📄 " + (f.name || f.kind || "file");
      box.append(chip);
    }
  }
}

function setHtml(el, html) {
  el.querySelector(".body").innerHTML = html;  // server-rendered, escaped HTML only
  log.scrollTop = log.scrollHeight;
}

function showTyping(on) {
  clearTimeout(typingTimer);
  typing.hidden = !on;
  if (on) typingTimer = setTimeout(() => { typing.hidden = true; }, 6000);
}

function onRow(ev) {
  const who = ev.role === "user" ? "You" : "Agent";
  const via = ev.platform && ev.platform !== "web" ? " · via " + ev.platform : "";
  let el = ev.message_id ? local.get(ev.message_id) : null;
  if (el) {
    local.delete(ev.message_id);  // the bubble keeps the name it was sent with
  } else {
    el = bubble(ev.role, who + via);
  }
  el.dataset.row = String(ev.id);
  showFiles(el, ev.attachments);
  setHtml(el, ev.html);
  after = Math.max(after, ev.id);
  session = ev.session || session;
  if (ev.role === "assistant") showTyping(false);
}

function onEvent(ev) {
  if (ev.type === "reset") {
    log.replaceChildren();
    local.clear();
    live.clear();
    session = ev.session;
    after = 0;
  } else if (ev.type === "row") {
    onRow(ev);
  } else if (ev.type === "reply" || ev.type === "preview") {
    let el = live.get(ev.id);
    if (!el) {
      el = bubble("assistant plain", "Agent");
      live.set(ev.id, el);
    }
    const growing = ev.type === "preview" || / …$/.test(ev.text || "");
    el.classList.toggle("live", growing);
    setHtml(el, ev.html);
    if (!growing) showTyping(false);  // typing stays on while the reply is still being written
  } else if (ev.type === "settled") {
    const el = live.get(ev.id);
    if (el) { el.remove(); live.delete(ev.id); }
    showTyping(false);
  } else if (ev.type === "typing") {
    showTyping(true);
  }
}

function connect() {
  const url = "/web/events?after=" + after + (session ? "&session=" + encodeURIComponent(session) : "");
  source = new EventSource(url);
  source.onopen = () => { statusLine.textContent = ""; };
  source.onmessage = (e) => onEvent(JSON.parse(e.data));
  source.onerror = () => {
    source.close();
    statusLine.textContent = "Reconnecting…";
    setTimeout(connect, 1500);
  };
}

function showPending() {
  pendingList.replaceChildren(...pending.map((file, i) => {
    const chip = document.createElement("button");
    chip.type = "button";
    chip.className = "file";
    chip.title = "Remove";
    chip.textContent = "📎 " + file.name + " ✕";
    chip.addEventListener("click", () => { pending.splice(i, 1); showPending(); });
    return chip;
  }));
}

function addFiles(list) {
  for (const file of list) {
    if (pending.length >= MAX_FILES) break;
    pending.push(file);
  }
  showPending();
}

// 503 = the gateway is starting or stopping (not ready, see /readyz): nothing was stored, so the
// same request (same message id: the server keeps one copy) is sent again, for up to a minute.
async function postWhenReady(url, options) {
  let wait = 500;
  for (let tries = 0; ; tries++) {
    let response;
    try {
      response = await fetch(url, options);
    } catch (err) {
      if (tries >= 20) throw err;  // the connection failed (restart in progress): try again
      response = null;
    }
    if (response && (response.status !== 503 || tries >= 20)) return response;
    const after = response && Number(response.headers.get("Retry-After"));
    await new Promise((done) => setTimeout(done, after > 0 ? Math.min(after * 1000, 10000) : wait));
    wait = Math.min(wait * 2, 5000);
  }
}

async function upload(file) {
  const response = await postWhenReady("/web/files", {
    method: "POST",
    headers: {"Content-Type": file.type || "application/octet-stream", "X-Requested-With": "gateway-web",
              "X-File-Name": encodeURIComponent(file.name)},
    body: file,
  });
  const answer = await response.json().catch(() => ({error: "HTTP " + response.status}));
  if (!response.ok) throw new Error(file.name + ": " + (answer.error || "HTTP " + response.status));
  return answer.file;
}

async function send(text, files) {
  const id = newId();
  const el = bubble("user", nameInput.value.trim() || "You");
  el.querySelector(".body").textContent = text || files.map((f) => f.name).join(", ");
  local.set(id, el);
  try {
    const uploaded = [];
    for (const file of files) uploaded.push(await upload(file));
    const response = await postWhenReady("/web/messages", {
      method: "POST",
      headers: {"Content-Type": "application/json", "X-Requested-With": "gateway-web"},
      body: JSON.stringify({id: id, text: text, name: nameInput.value.trim(), files: uploaded}),
    });
    const answer = await response.json().catch(() => ({error: "HTTP " + response.status}));
    if (!response.ok) throw new Error(answer.error || "HTTP " + response.status);
  } catch (err) {
    el.classList.add("failed");
    const note = document.createElement("div");
    note.className = "error";
    note.textContent = "Not sent: " + err.message;
    el.append(note);
    local.delete(id);
    if (!textInput.value) textInput.value = text;  // nothing typed is lost
    if (!pending.length) { pending = files; showPending(); }  // nor anything attached
  }
}

form.addEventListener("submit", (e) => {
  e.preventDefault();
  const text = textInput.value.trim();
  const files = pending;
  if (!text && !files.length) return;
  textInput.value = "";
  pending = [];
  showPending();
  send(text, files);
});
fileInput.addEventListener("change", () => { addFiles(fileInput.files); fileInput.value = ""; });
document.addEventListener("dragover", (e) => { e.preventDefault(); document.body.classList.add("dropping"); });
document.addEventListener("dragleave", (e) => { if (!e.relatedTarget) document.body.classList.remove("dropping"); });
document.addEventListener("drop", (e) => {
  e.preventDefault();
  document.body.classList.remove("dropping");
  if (e.dataTransfer && e.dataTransfer.files.length) addFiles(e.dataTransfer.files);
});
textInput.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    form.requestSubmit();
  }
});

connect();
