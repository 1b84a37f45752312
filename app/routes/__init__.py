"""One router per endpoint family. Each route validates, hands its work to a service, and answers."""
