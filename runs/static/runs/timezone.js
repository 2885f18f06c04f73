// Tells Gatehouse the reader's time zone (a cookie read by
// runs.timezones.ReaderTimezoneMiddleware), so that the admin writes times in
// the zone of the person reading them. A file, not an inline script: the
// Content-Security-Policy runs scripts from this origin's files only.
(function () {
  var zone = Intl.DateTimeFormat().resolvedOptions().timeZone;
  if (!zone) {
    return;
  }
  var cookie = "gatehouse_tz=" + encodeURIComponent(zone);
  if (document.cookie.split("; ").indexOf(cookie) === -1) {
    document.cookie = cookie + "; path=/; max-age=31536000; SameSite=Lax";
  }
})();
