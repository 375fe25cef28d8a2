// Starling's dashboard: the live parts, in plain JavaScript (no library, nothing from elsewhere).
// - forms with data-confirm ask first;
// - the Logs page follows its table's data-stream over Server-Sent Events;
// - the WhatsApp page looks for a new linking code every two seconds.
"use strict";

document.addEventListener("submit", function (event) {
  var form = event.target;
  var question = form.getAttribute("data-confirm");
  if (question && !window.confirm(question)) event.preventDefault();
});

function cell(row, text) {
  var td = document.createElement("td");
  td.textContent = text;
  row.appendChild(td);
  return td;
}

function followLogs(body) {
  var source = new EventSource(body.getAttribute("data-stream"));
  var state = document.getElementById("log-state");
  var kept = 2000;
  source.onmessage = function (message) {
    var line = JSON.parse(message.data);
    var none = body.querySelector("tr.none");
    if (none) none.remove();
    var row = document.createElement("tr");
    row.className = "lvl-" + line.level + " live";
    cell(row, (line.ts || "").slice(11, 19));
    cell(row, line.level);
    cell(row, line.service);
    cell(row, line.event);
    cell(row, line.rest).className = "detail";
    body.appendChild(row);
    while (body.rows.length > kept) body.deleteRow(0);
    if (state) state.textContent = "following: last line at " + new Date().toLocaleTimeString();
  };
  source.onerror = function () {
    if (state) state.textContent = "reconnecting…";
  };
}

function watchLinking(card) {
  var instance = card.getAttribute("data-instance");
  var image = card.querySelector("img.qr");
  var status = card.querySelector(".wa-status");
  var output = card.querySelector(".wa-output");
  var lastCode = null;
  function look() {
    fetch("/whatsapp/state?instance=" + encodeURIComponent(instance), {credentials: "same-origin"})
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (s) {
        if (!s) return;
        var key = s.kind + ":" + s.since;
        if (s.kind === "qr" && key !== lastCode) {
          image.src = "/whatsapp/qr.svg?instance=" + encodeURIComponent(instance) + "&t=" + Date.now();
        }
        image.classList.toggle("hidden", s.kind !== "qr");
        if (s.kind === "qr") status.textContent = "Scan this with WhatsApp on the phone: Settings → Linked devices → Link a device.";
        else if (s.kind === "pair") status.textContent = "On the phone: Linked devices → Link with phone number instead, and enter " + s.pair;
        else if (s.running) status.textContent = "Starting; the code shows here within seconds.";
        else status.textContent = "No linking is running." + (s.exit !== null ? " The last one ended (exit " + s.exit + ")." : "");
        output.textContent = s.output;
        lastCode = key;
      })
      .catch(function () {});
  }
  window.setInterval(look, 2000);
}

document.addEventListener("DOMContentLoaded", function () {
  var body = document.getElementById("log-lines");
  if (body && body.getAttribute("data-stream")) followLogs(body);
  document.querySelectorAll("section.wa").forEach(watchLinking);
});
