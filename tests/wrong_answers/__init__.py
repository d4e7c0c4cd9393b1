"""Wrong student answers, one module per lab, that the lab's checks must reject."""
