# Makes the public libtern.a from the internal archive: every object of IN
# is linked into one relocatable object (ld -r), whose globals are then made
# local except the functions declared in HEADER (include/tern.h), and that
# one object is archived as OUT. An embedding program sees only the tern_
# API; the internal names (http_reply, sc_*, ...) cannot collide with its
# own. Tests, benchmarks and the CLI link the internal archive instead.
#   cmake -DIN=libtern_internal.a -DOUT=libtern.a -DHEADER=tern.h
#         -DLD=ld -DOBJCOPY=objcopy -DAR=ar -P public_archive.cmake
foreach(v IN ITEMS IN OUT HEADER LD OBJCOPY AR)
  if(NOT DEFINED ${v} OR "${${v}}" STREQUAL "")
    message(FATAL_ERROR "public_archive.cmake: ${v} not set")
  endif()
endforeach()

# The kept names: every `tern_xxx(` of the header outside comments.
file(READ ${HEADER} text)
string(REGEX REPLACE "/\\*([^*]|\\*+[^*/])*\\*+/" "" text "${text}")
string(REGEX MATCHALL "tern_[A-Za-z0-9_]+[ \t]*\\(" calls "${text}")
set(keep "")
foreach(c ${calls})
  string(REGEX REPLACE "[ \t]*\\($" "" name "${c}")
  list(APPEND keep ${name})
endforeach()
list(REMOVE_DUPLICATES keep)
if(NOT keep)
  message(FATAL_ERROR "public_archive.cmake: no tern_ function found in ${HEADER}")
endif()
list(JOIN keep "\n" keep_text)
set(keep_file ${OUT}.keep)
file(WRITE ${keep_file} "${keep_text}\n")

set(obj ${OUT}.o)
execute_process(COMMAND ${LD} -r --whole-archive ${IN} -o ${obj} RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "public_archive.cmake: ${LD} -r failed (${rc})")
endif()
execute_process(COMMAND ${OBJCOPY} --keep-global-symbols=${keep_file} ${obj} RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "public_archive.cmake: ${OBJCOPY} failed (${rc})")
endif()
file(REMOVE ${OUT})
execute_process(COMMAND ${AR} rcs ${OUT} ${obj} RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "public_archive.cmake: ${AR} failed (${rc})")
endif()
file(REMOVE ${obj})
