#!/usr/bin/env bash
# Never run (tagged manual): //tests/layering:layering_aspect_test only analyses its edges.
exit 0
