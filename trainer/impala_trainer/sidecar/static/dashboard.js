// ImpalaJob dashboard: polls status and history (relative URLs, so it works under any path
// prefix) and draws its plots as plain SVG. No libraries: the page must work with no internet.
"use strict";

const POLL_MS = 2000;
const HISTORY_LIMIT = 500;
const SVG_NS = "http://www.w3.org/2000/svg";
const W = 640, H = 320, M = { left: 62, right: 16, top: 12, bottom: 40 };

function $(id) { return document.getElementById(id); }

async function getJSON(path) {
  const r = await fetch(path, { cache: "no-store", credentials: "same-origin" });
  let body = null;
  try { body = await r.json(); } catch (e) { body = null; }
  if (!r.ok) {
    const why = body && body.detail ? `${body.error}: ${body.detail}` : `HTTP ${r.status}`;
    throw new Error(`${path} → ${r.status} ${why}`);
  }
  return body;
}

// Numbers for humans: compact (12.5k) above a thousand, fixed digits below.
function fmt(v, digits) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  const a = Math.abs(v);
  const trim = (x) => String(Number(x.toPrecision(3)));
  if (a >= 1e9) return trim(v / 1e9) + "G";
  if (a >= 1e6) return trim(v / 1e6) + "M";
  if (a >= 1e3) return trim(v / 1e3) + "k";
  if (Number.isInteger(v)) return String(v);
  return v.toFixed(digits === undefined ? 2 : digits);
}

// Counters in the cards: exact, with thousands separators.
function count(v) { return v === null || v === undefined ? "–" : v.toLocaleString("en-US"); }

function fmtDuration(s) {
  if (!s && s !== 0) return "–";
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = Math.floor(s % 60);
  return h ? `${h}h ${m}m` : m ? `${m}m ${sec}s` : `${sec}s`;
}

// "Nice" tick values (1, 2, 5 × 10^k) covering [lo, hi].
function ticks(lo, hi, count) {
  if (hi === lo) { hi = lo + 1; }
  const raw = (hi - lo) / count, mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw);
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(v);
  return out;
}

function el(name, attrs, text) {
  const e = document.createElementNS(SVG_NS, name);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

// Draw one line plot of pairs [x, y]; each datum is also a <circle class="pt"> carrying its
// exact values in data-x / data-y (hover shows them; tests read them back).
function plot(svg, pairs, xLabel, yLabel, xFmt, yFromZero) {
  svg.replaceChildren();
  if (!pairs.length) {
    svg.appendChild(el("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty" },
      "no data yet"));
    return;
  }
  const xs = pairs.map((p) => p[0]), ys = pairs.map((p) => p[1]);
  let x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
  if (x1 === x0) { x1 = x0 + 1; }
  if (yFromZero) { y0 = Math.min(0, y0); }  // rates: a zero baseline keeps noise in proportion
  if (y1 === y0) { y0 -= 1; y1 += 1; }
  const yt = ticks(y0, y1, 5), xt = ticks(x0, x1, 6);
  y0 = Math.min(y0, yt[0]); y1 = Math.max(y1, yt[yt.length - 1]);
  const sx = (x) => M.left + ((x - x0) / (x1 - x0)) * (W - M.left - M.right);
  const sy = (y) => H - M.bottom - ((y - y0) / (y1 - y0)) * (H - M.top - M.bottom);
  const g = el("g", { class: "axes" });
  for (const t of yt) {
    g.appendChild(el("line", { class: "grid", x1: M.left, x2: W - M.right, y1: sy(t), y2: sy(t) }));
    g.appendChild(el("text", { x: M.left - 6, y: sy(t) + 4, "text-anchor": "end" }, fmt(t)));
  }
  for (const t of xt) {
    if (t < x0 || t > x1) continue;
    g.appendChild(el("line", { class: "axis", x1: sx(t), x2: sx(t), y1: H - M.bottom,
      y2: H - M.bottom + 4 }));
    g.appendChild(el("text", { x: sx(t), y: H - M.bottom + 16, "text-anchor": "middle" },
      (xFmt || fmt)(t)));
  }
  g.appendChild(el("line", { class: "axis", x1: M.left, x2: W - M.right, y1: H - M.bottom,
    y2: H - M.bottom }));
  g.appendChild(el("text", { x: (M.left + W - M.right) / 2, y: H - 4, "text-anchor": "middle" },
    xLabel));
  g.appendChild(el("text", { x: 12, y: (M.top + H - M.bottom) / 2, "text-anchor": "middle",
    transform: `rotate(-90 12 ${(M.top + H - M.bottom) / 2})` }, yLabel));
  svg.appendChild(g);
  const path = pairs.map((p) => `${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(" ");
  svg.appendChild(el("polyline", { class: "line", points: path }));
  const dots = el("g", { class: "points" });
  const r = pairs.length > 200 ? 1.5 : 2.5;
  for (const [x, y] of pairs) {
    const c = el("circle", { class: "pt", cx: sx(x).toFixed(1), cy: sy(y).toFixed(1), r: r,
      "data-x": x, "data-y": y });
    c.appendChild(el("title", {}, `${xLabel} ${fmt(x)}: ${yLabel} ${fmt(y)}`));
    dots.appendChild(c);
  }
  svg.appendChild(dots);
}

function card(label, value, progress) {
  const d = document.createElement("div");
  d.className = "card";
  const l = document.createElement("div"); l.className = "label"; l.textContent = label;
  const v = document.createElement("div"); v.className = "value"; v.textContent = value;
  d.append(l, v);
  if (progress !== undefined) {
    const bar = document.createElement("div"); bar.className = "bar";
    const fill = document.createElement("div");
    fill.style.width = `${Math.round(Math.max(0, Math.min(1, progress)) * 100)}%`;
    bar.appendChild(fill); d.appendChild(bar);
  }
  return d;
}

function table(id, rows) {
  const t = $(id);
  t.replaceChildren();
  for (const [k, v] of rows) {
    const tr = document.createElement("tr");
    const a = document.createElement("td"); a.textContent = k;
    const b = document.createElement("td"); b.textContent = v;
    tr.append(a, b); t.appendChild(tr);
  }
}

function renderStatus(s) {
  document.title = `${s.job} · ${s.phase} · ImpalaJob`;
  $("job").textContent = s.job;
  $("phase").textContent = s.phase;
  $("phase").className = `phase ${s.phase}`;
  $("message").textContent = s.message ? `${s.message} · ` : "";
  $("updated").textContent = `snapshot ${fmt(s.age_seconds, 1)} s old`;
  const c = s.counters, t = s.throughput, q = s.learner_queue, m = s.membership;
  const stop = s.stop.stopped_by ? `done (${s.stop.stopped_by})`
    : `${Math.round(s.stop.progress * 100)}%`;
  $("cards").replaceChildren(
    card("Env steps sampled", count(c.num_env_steps_sampled)),
    card("Episodes", count(c.episodes)),
    card("Mean return (100 ep)", fmt(s.episode_return_mean)),
    // A self-play job's trend follows its evaluation rounds (its training return is 0).
    card(s.return_trend.source === "evaluation" ? "Best evaluation return" : "Best mean return",
      fmt(s.return_trend.best_return_mean)),
    card("Mean episode length", fmt(s.episode_len_mean, 1)),
    card("Env steps / s", fmt(t.env_steps_per_s, 1)),
    card("Trained steps / s", fmt(t.trained_steps_per_s, 1)),
    card("Learner updates", count(c.learner_updates)),
    card("Learner queue fill", `${Math.round(q.fill * 100)}%`, q.fill),
    card("Learner idle", `${Math.round(q.learner_idle_fraction * 100)}%`),
    card("Rollouts / aggregators", `${m.rollout_workers} / ${m.aggregator_workers}`),
    card("Policy lag", fmt(s.policy_lag_mean, 1)),
    card("Training time", fmtDuration(s.wall_seconds)),
    card("Stop progress", stop, s.stop.progress),
    card("Last checkpoint (steps)", s.checkpoint ? count(s.checkpoint.num_env_steps_sampled) : "none"),
    ...evaluationCards(s.evaluation),
    ...policyCards(s.policies),
  );
  renderEvaluation(s.evaluation);
  // The learned policy being lost (the job's ReturnRegressed condition says the same).
  $("regressed").hidden = !s.return_trend.regressed;
  $("regressed").textContent = s.return_trend.regressed
    ? `Return regressed: ${s.return_trend.message}` : "";
  table("learner", Object.entries(s.learner).map(([k, v]) => [k, fmt(v, 4)]));
  table("timing", Object.entries(s.timing_breakdown).map(([k, v]) => [k, fmt(v, 2)]));
  const counts = {};
  for (const x of m.members) {
    const key = `${x.role} ${x.state}`;
    counts[key] = (counts[key] || 0) + 1;
  }
  table("members", Object.entries(counts));
}

function evaluationCards(e) {
  if (!e) return [];
  const out = [
    card("Evaluation return", fmt(e.episode_return_mean)),
    card("Best evaluation", `${fmt(e.best_return_mean)} @ ${fmt(e.best_num_env_steps_sampled)}`),
  ];
  if (e.win_rate !== null && e.win_rate !== undefined) {
    out.push(card(`Win rate (${e.policy} vs ${e.opponent})`,
      `${Math.round(e.win_rate * 100)}%`, e.win_rate));
  }
  return out;
}

// A multi-agent job's policies: each one's mean return per agent, and its score against the
// self-play pool where it plays itself.
function policyCards(policies) {
  return Object.entries(policies || {}).flatMap(([name, p]) => {
    const out = [card(`Policy ${name}: mean return`, fmt(p.episode_return_mean))];
    if (p.self_play_score !== null && p.self_play_score !== undefined) {
      out.push(card(`Policy ${name}: score vs pool`, fmt(p.self_play_score, 3)));
    }
    return out;
  });
}

// The latest evaluation video (an mp4, or a GIF where the trainer had no encoder); the element
// is only reloaded when a new one appears, so a playing video is not restarted every poll.
function renderEvaluation(e) {
  $("evaluation").hidden = !e;
  if (!e) return;
  const video = $("eval-video"), gif = $("eval-gif");
  $("eval-no-video").hidden = !!e.video;
  $("eval-video-caption").textContent = e.video
    ? `Evaluation at ${count(e.num_env_steps_sampled)} env steps: return ${fmt(e.episode_return_mean)}`
    : "Latest evaluation episode";
  if (!e.video) return;
  const isGif = e.video.endsWith(".gif");
  video.hidden = isGif; gif.hidden = !isGif;
  const target = isGif ? gif : video;
  if (target.getAttribute("src") !== e.video) target.setAttribute("src", e.video);
}

function renderHistory(h) {
  const pts = h.points;
  const ret = pts.filter((p) => p.episode_return_mean !== null)
    .map((p) => [p.env_steps, p.episode_return_mean]);
  plot($("plot-return"), ret, "env steps", "mean return");
  const long = pts.length && pts[pts.length - 1].wall_seconds > 600;
  plot($("plot-throughput"), pts.map((p) => [p.wall_seconds, p.env_steps_per_s]),
    long ? "training time (min)" : "training time (s)", "env steps/s",
    long ? (v) => fmt(v / 60, 0) : undefined, true);
  // One point per evaluation: history lines repeat the latest until the next one.
  const seen = new Map();
  for (const p of pts) {
    if (p.evaluation_env_steps !== null && p.evaluation_env_steps !== undefined
        && p.evaluation_return_mean !== null) {
      seen.set(p.evaluation_env_steps, p.evaluation_return_mean);
    }
  }
  const evals = [...seen.entries()].sort((a, b) => a[0] - b[0]);
  if (evals.length) plot($("plot-evaluation"), evals, "env steps", "evaluation return");
  $("history-info").textContent =
    `${pts.length} of ${h.matched} history points shown (${h.held} held, ` +
    `${h.lines_read} lines read, ${h.skipped_lines} skipped)`;
}

async function tick() {
  const problems = [];
  try { renderStatus(await getJSON("status")); } catch (e) { problems.push(e.message); }
  try { renderHistory(await getJSON(`history?limit=${HISTORY_LIMIT}`)); }
  catch (e) { problems.push(e.message); }
  $("error").hidden = problems.length === 0;
  $("error").textContent = problems.join("\n");
}

// The video element records the frame size it decoded (as the plots carry their data): what
// a reader of the DOM, a test among them, checks to know the browser plays the file.
$("eval-video").addEventListener("loadeddata", (ev) => {
  ev.target.dataset.decoded = `${ev.target.videoWidth}x${ev.target.videoHeight}`;
});

tick();
setInterval(tick, POLL_MS);
