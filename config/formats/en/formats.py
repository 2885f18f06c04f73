"""The admin's one way of writing a time: date, time to the second, and the
zone it is in (the reader's zone when their browser said it, see
runs.timezones; UTC otherwise). Django's English default ("Nov. 30, 2026,
6:44 p.m.") has neither seconds nor a zone."""

DATETIME_FORMAT = "Y-m-d H:i:s T"
SHORT_DATETIME_FORMAT = DATETIME_FORMAT
DATE_FORMAT = "Y-m-d"
SHORT_DATE_FORMAT = DATE_FORMAT
TIME_FORMAT = "H:i:s"
