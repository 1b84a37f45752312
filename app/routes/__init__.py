"""One router per endpoint family."""
