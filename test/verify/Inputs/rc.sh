# Runs a command and prints its exit code last, for FileCheck.
"$@"
echo "exit code $?"
