// trinity view: poll the server while a run is live and swap in the fragments it renders.
// Elements with data-live="NAME" are replaced by fragments[NAME] of the JSON at data-poll.
(function () {
  const root = document.querySelector("[data-poll]");
  if (!root) return;
  const url = root.getAttribute("data-poll");
  const every = Number(root.getAttribute("data-every") || "2000");
  async function poll() {
    try {
      const response = await fetch(url, { cache: "no-store", credentials: "same-origin" });
      if (response.ok) {
        const data = await response.json();
        for (const [name, html] of Object.entries(data.fragments || {})) {
          const el = document.querySelector('[data-live="' + name + '"]');
          if (el && el.innerHTML !== html) el.innerHTML = html;
        }
        document.body.setAttribute("data-polled", String(Date.now()));
      }
    } catch (err) {
      // the server stopped or restarted: keep the page, try again later
    }
    setTimeout(poll, every);
  }
  setTimeout(poll, every);
})();
