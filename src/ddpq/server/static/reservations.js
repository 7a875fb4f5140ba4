// ddpq's web page, reservations: GPUs kept for one user's jobs in a window (ddpq admin
// reserve), in force or to come. The section is hidden while there are none. As in app.js,
// what the API says reaches the page only as text, never as markup.
"use strict";

const rsv = { items: [] };

async function loadReservations() {
  rsv.items = (await getJson("/v1/reservations")).items;
}

function renderReservations() {
  const body = el("tbody", { id: "reservations-body" });
  const at = (iso) => new Date(iso).toLocaleString([], { dateStyle: "short", timeStyle: "short" });
  for (const r of rsv.items) {
    body.append(
      el(
        "tr",
        { "data-reservation-id": r.id, "data-active": r.active ? "true" : "false" },
        el("td", { class: "num", text: r.id }),
        el("td", { text: r.user }),
        el("td", { class: "num", text: r.gpus }),
        el("td", { text: at(r.start) }),
        el("td", { text: at(r.end) }),
        el("td", { text: r.active ? "in force" : "to come" }),
      ),
    );
  }
  $("reservations-body").replaceWith(body);
  $("reservations-section").hidden = rsv.items.length === 0;
}
