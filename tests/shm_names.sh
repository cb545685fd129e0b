# Sourced by the tests that check that jobs leave no name in /dev/shm.
# Other tests run jobs at the same time (ctest -j): their names live only
# through their init (or until their launcher cleans up after a failure),
# so a name counts as left over only if it stays new for 10 samples.
# usage: shm_names_before FILE; ... ; shm_names_left FILE (prints them)
shm_names_before() { ls /dev/shm | grep '^cm-' > "$1" || true; }
shm_names_left() {
  left=""
  for try in 1 2 3 4 5 6 7 8 9 10; do
    left=$(ls /dev/shm | grep '^cm-' | grep -vxF -f "$1" || true)
    [ -z "$left" ] && break
    sleep 1
  done
  printf '%s' "$left"
}
