// levers9's dashboard: the live parts of a page, pushed by the server (server-sent events).
//   [data-live=SRC]  replaced by each `message` of /ui/events?src=SRC (sent only on a change)
//   [data-logs=URL]  a task's output, appended as its worker writes it (`follow` scrolls)
//   [data-copy=TEXT] copies TEXT (the equivalent CLI command)
// An event stream that breaks shows the "cannot be reached" banner; the browser reconnects by
// itself and the banner goes once a stream is open again.
(function () {
  "use strict";
  const offline = () => document.getElementById("offline");
  let broken = 0;
  function watch(source) {
    source.addEventListener("open", function () {
      if (source.wasBroken) { source.wasBroken = false; broken -= 1; }
      if (broken <= 0 && offline()) offline().hidden = true;
    });
    source.addEventListener("error", function () {
      if (source.readyState === EventSource.CLOSED) return;
      if (!source.wasBroken) { source.wasBroken = true; broken += 1; }
      if (offline()) offline().hidden = false;
    });
    source.addEventListener("signed-out", function () {
      source.close();
      window.location.assign("/ui/sign-in");
    });
  }
  function live(element) {
    const source = new EventSource("/ui/events?src=" + encodeURIComponent(element.dataset.live));
    watch(source);
    source.addEventListener("message", function (event) {
      element.innerHTML = JSON.parse(event.data);
      if (window.htmx) window.htmx.process(element);
    });
  }
  function logs(element) {
    const source = new EventSource(element.dataset.logs);
    const follow = document.getElementById("follow");
    watch(source);
    source.addEventListener("message", function (event) {
      element.append(document.createTextNode(JSON.parse(event.data)));
      if (!follow || follow.checked) element.scrollTop = element.scrollHeight;
    });
    source.addEventListener("end", function () {
      source.close();
      element.dataset.ended = "true";
    });
    source.addEventListener("failed", function (event) {
      source.close();
      const note = document.createElement("p");
      note.className = "problem";
      note.textContent = JSON.parse(event.data);
      element.after(note);
    });
  }
  document.addEventListener("click", function (event) {
    const button = event.target.closest("[data-copy]");
    if (button && navigator.clipboard) {
      navigator.clipboard.writeText(button.dataset.copy).then(function () {
        button.textContent = "Copied";
      });
    }
  });
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-live]").forEach(live);
    document.querySelectorAll("[data-logs]").forEach(logs);
  });
})();
