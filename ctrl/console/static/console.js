// Live updates for the Krane console. Each page works without this script
// (plain links, forms and reloads); with it, the page's live region is
// replaced whenever the server sends a newer rendering of it.
(function () {
  "use strict";
  var live = document.getElementById("live");
  var status = document.querySelector("[data-live-status]");
  if (!live || !window.EventSource) {
    return;
  }
  var source = new EventSource(window.location.pathname + window.location.search);
  source.addEventListener("live", function (e) {
    // Keep keyboard focus where it was when the element is still there.
    var focused = document.activeElement && document.activeElement.id;
    live.innerHTML = e.data;
    if (focused && focused !== "main") {
      var again = document.getElementById(focused);
      if (again) {
        again.focus();
      }
    }
    live.setAttribute("data-updated", String(Date.now()));
    if (status) {
      status.textContent = "Live: updated " + new Date().toLocaleTimeString() + ".";
    }
  });
  // A submitted form decides where the browser goes next (its redirect);
  // the stream must not navigate away under it, e.g. when the form ended
  // the session.
  document.addEventListener("submit", function () {
    source.close();
  });
  // Only a path of this console is followed: whatever an event carries,
  // the browser never leaves the console's origin.
  function localPath(p) {
    if (typeof p !== "string" || p.charAt(0) !== "/" || /[\\\u0000-\u001f\u007f]/.test(p) || p.charAt(1) === "/") {
      return "/login";
    }
    var to = new URL(p, window.location.href);
    if (to.origin !== window.location.origin) {
      return "/login";
    }
    return to.pathname + to.search;
  }
  source.addEventListener("signedout", function (e) {
    source.close();
    window.location.assign(localPath(e.data));
  });
  source.addEventListener("error", function () {
    if (status) {
      status.textContent = "Live updates interrupted; retrying. Reload to see the latest.";
    }
  });
  document.documentElement.classList.add("live");
})();
