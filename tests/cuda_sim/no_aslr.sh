#!/bin/sh
# Runs a ThreadSanitizer program with address-space randomisation off where the system allows it
# (setarch -R): some kernels randomise more bits than older TSan runtimes map around.
if setarch "$(uname -m)" -R true 2>/dev/null; then exec setarch "$(uname -m)" -R "$@"; fi
exec "$@"
