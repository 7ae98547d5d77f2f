# Copies docs/checks/*.md to the build tree (cmake -DSRC=... -DDST=... -P).
# A script rather than copy_directory: the source may not exist yet.
file(MAKE_DIRECTORY "${DST}")
file(GLOB docs "${SRC}/*.md")
if(docs)
  file(COPY ${docs} DESTINATION "${DST}")
endif()
